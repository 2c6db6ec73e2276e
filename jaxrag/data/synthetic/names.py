"""Pronounceable generated names, built from a small syllable inventory (seeded, no real-world names)."""

from __future__ import annotations

import numpy as np

ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr", "sh")
VOWELS = ("a", "e", "i", "o", "u")
CODAS = ("", "", "n", "r", "l", "s")

FILM_NOUNS = ("Garden", "River", "Crown", "Shadow", "Road", "Mirror", "Harbor", "Winter", "Storm", "Lantern")
COMPANY_SUFFIXES = ("Works", "Labs", "Group", "Motors", "Foods", "Systems")
COUNTRY_SUFFIXES = ("ia", "land", "istan", "ora")


def syllable(rng: np.random.Generator) -> str:
    return ONSETS[rng.integers(len(ONSETS))] + VOWELS[rng.integers(len(VOWELS))] + CODAS[rng.integers(len(CODAS))]


def word(rng: np.random.Generator, n_syllables: int = 2) -> str:
    return "".join(syllable(rng) for _ in range(n_syllables)).capitalize()


def person_name(rng, firsts: list[str], lasts: list[str]) -> str:
    """First + last drawn from shared pools, so distinct people share first names or surnames."""
    return f"{firsts[rng.integers(len(firsts))]} {lasts[rng.integers(len(lasts))]}"


def film_name(rng) -> str:
    return f"{word(rng)} {FILM_NOUNS[rng.integers(len(FILM_NOUNS))]}"


def company_name(rng) -> str:
    return f"{word(rng)} {COMPANY_SUFFIXES[rng.integers(len(COMPANY_SUFFIXES))]}"


def city_name(rng) -> str:
    return word(rng, 2 + int(rng.integers(2)))


def country_name(rng) -> str:
    return word(rng, 1 + int(rng.integers(2))) + COUNTRY_SUFFIXES[rng.integers(len(COUNTRY_SUFFIXES))]


def unique_names(make, n: int, taken: set[str], max_tries: int = 200) -> list[str]:
    """n names from `make()` that collide with nothing in `taken` (case-insensitive); updates `taken`."""
    out = []
    for _ in range(n):
        for _ in range(max_tries):
            name = make()
            if name.lower() not in taken:
                break
        else:
            raise ValueError(f"could not draw a unique name after {max_tries} tries; lower the entity counts")
        taken.add(name.lower())
        out.append(name)
    return out
