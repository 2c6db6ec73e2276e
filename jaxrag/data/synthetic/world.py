"""The synthetic world: typed entities, relations between them, and one passage per fact (seeded).

Every fact is stated by exactly one passage (one sentence, title = subject name) in one of several paraphrase
templates. Distractor relations (visits, film casts, rivals) add passages that share names and words with the
facts questions ask about; people draw first names and surnames from shared pools, so names overlap too.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrag.data.synthetic import names

# relation -> (subject type, object type); object type "year" is a literal.
RELATIONS = {
    "born_in": ("person", "city"),
    "birth_year": ("person", "year"),
    "works_for": ("person", "company"),
    "in_country": ("city", "country"),
    "directed_by": ("film", "person"),
    "released_in": ("film", "year"),
    "based_in": ("company", "city"),
    "founded_by": ("company", "person"),
    # distractor relations: never asked about
    "visited": ("person", "city"),
    "starring": ("film", "person"),
    "rival_of": ("company", "company"),
}
DISTRACTOR_RELATIONS = ("visited", "starring", "rival_of")

TEMPLATES = {
    "born_in": ("{s} was born in {o}.", "{s} is a native of {o}.", "The birthplace of {s} is {o}."),
    "birth_year": ("{s} was born in the year {o}.", "{s} came into the world in {o}.", "The birth year of {s} is {o}."),
    "works_for": ("{s} works for {o}.", "{s} is employed by {o}.", "The employer of {s} is {o}."),
    "in_country": ("{s} is a city in {o}.", "{s} lies in the country of {o}.", "The country of {s} is {o}."),
    "directed_by": ("{s} was directed by {o}.", "{s} is a film by director {o}.", "The director of {s} is {o}."),
    "released_in": ("{s} was released in {o}.", "{s} came out in {o}.", "The release year of {s} is {o}."),
    "based_in": ("{s} is based in {o}.", "{s} has its headquarters in {o}.", "The headquarters of {s} is in {o}."),
    "founded_by": ("{s} was founded by {o}.", "{s} is a company started by {o}.", "The founder of {s} is {o}."),
    "visited": ("{s} once visited {o}.", "{s} travelled to {o} for work.", "A trip took {s} to {o}."),
    "starring": ("{s} starred the actor {o}.", "{s} features {o} in the lead role.", "The lead actor of {s} is {o}."),
    "rival_of": ("{s} competes with {o}.", "{s} is a rival of {o}.", "The main rival of {s} is {o}."),
}


@dataclasses.dataclass(frozen=True)
class Entity:
    id: str
    type: str  # person | film | city | country | company
    name: str
    heldout: bool = False


@dataclasses.dataclass(frozen=True)
class Fact:
    subject: str  # entity id
    relation: str
    object: str  # entity id, or the literal year
    passage_id: str


@dataclasses.dataclass(frozen=True)
class Passage:
    id: str
    title: str
    contents: str
    subject: str
    relation: str
    object: str
    distractor: bool


@dataclasses.dataclass
class World:
    seed: int
    entities: dict[str, Entity]
    facts: dict[tuple[str, str], Fact]  # (subject id, relation) -> fact
    passages: list[Passage]

    def name(self, ref: str) -> str:
        """Surface form of an object: an entity's name, or the literal itself (years)."""
        return self.entities[ref].name if ref in self.entities else ref

    def of_type(self, type_: str, heldout: bool | None = None) -> list[Entity]:
        return [e for e in self.entities.values() if e.type == type_ and (heldout is None or e.heldout == heldout)]

    def passage(self, pid: str) -> Passage:
        return self._by_id[pid]

    def __post_init__(self):
        self._by_id = {p.id: p for p in self.passages}


def _pick(rng, items: list) -> object:
    return items[int(rng.integers(len(items)))]


def generate_world(
    seed: int = 0,
    n_countries: int = 10,
    n_cities: int = 50,
    n_persons: int = 300,
    n_films: int = 150,
    n_companies: int = 60,
    heldout_frac: float = 0.1,
    p_distractor: float = 0.5,
) -> World:
    """A seeded world. Held-out people, films and companies only relate to each other (and shared places), so
    questions about them are about entirely new names."""
    for key, n in dict(
        n_countries=n_countries, n_cities=n_cities, n_persons=n_persons, n_films=n_films, n_companies=n_companies
    ).items():
        if n < 2:
            raise ValueError(f"generate_world: {key}={n} must be >= 2")
    if not 0.0 <= heldout_frac < 0.5:
        raise ValueError(f"generate_world: heldout_frac={heldout_frac} must be in [0, 0.5)")
    rng = np.random.default_rng(seed)
    taken: set[str] = set()
    countries = names.unique_names(lambda: names.country_name(rng), n_countries, taken)
    cities = names.unique_names(lambda: names.city_name(rng), n_cities, taken)
    firsts = names.unique_names(lambda: names.word(rng), max(8, n_persons // 6), taken)
    lasts = names.unique_names(lambda: names.word(rng), max(8, n_persons // 5), taken)
    persons = names.unique_names(lambda: names.person_name(rng, firsts, lasts), n_persons, taken)
    films = names.unique_names(lambda: names.film_name(rng), n_films, taken)
    companies = names.unique_names(lambda: names.company_name(rng), n_companies, taken)

    entities: dict[str, Entity] = {}

    def add(type_: str, name_list: list[str], can_hold_out: bool) -> list[str]:
        n_held = max(2, int(round(heldout_frac * len(name_list)))) if can_hold_out and heldout_frac > 0 else 0
        ids = []
        for i, nm in enumerate(name_list):
            eid = f"{type_}{i}"
            entities[eid] = Entity(eid, type_, nm, heldout=i >= len(name_list) - n_held)
            ids.append(eid)
        return ids

    country_ids = add("country", countries, False)
    city_ids = add("city", cities, False)
    person_ids = add("person", persons, True)
    film_ids = add("film", films, True)
    company_ids = add("company", companies, True)

    def pool(ids: list[str], heldout: bool) -> list[str]:
        return [i for i in ids if entities[i].heldout == heldout]

    triples: list[tuple[str, str, str]] = []
    for c in city_ids:
        triples.append((c, "in_country", _pick(rng, country_ids)))
    for p in person_ids:
        h = entities[p].heldout
        born = _pick(rng, city_ids)
        triples += [
            (p, "born_in", born),
            (p, "birth_year", str(int(rng.integers(1900, 2000)))),
            (p, "works_for", _pick(rng, pool(company_ids, h))),
        ]
        if rng.random() < p_distractor:
            triples.append((p, "visited", _pick(rng, [c for c in city_ids if c != born])))
    for f in film_ids:
        h = entities[f].heldout
        director = _pick(rng, pool(person_ids, h))
        triples += [(f, "directed_by", director), (f, "released_in", str(int(rng.integers(1930, 2020))))]
        actors = [p for p in pool(person_ids, h) if p != director]
        if rng.random() < p_distractor and actors:
            triples.append((f, "starring", _pick(rng, actors)))
    for co in company_ids:
        h = entities[co].heldout
        triples += [(co, "based_in", _pick(rng, city_ids)), (co, "founded_by", _pick(rng, pool(person_ids, h)))]
        rivals = [c for c in pool(company_ids, h) if c != co]
        if rng.random() < p_distractor and rivals:
            triples.append((co, "rival_of", _pick(rng, rivals)))

    order = rng.permutation(len(triples))  # passage ids carry no information about the entity
    facts, passages = {}, []
    for n, i in enumerate(order):
        s, rel, o = triples[i]
        pid = f"syn{n}"
        template = _pick(rng, list(TEMPLATES[rel]))
        obj_name = entities[o].name if o in entities else o
        passages.append(
            Passage(
                pid,
                entities[s].name,
                template.format(s=entities[s].name, o=obj_name),
                s,
                rel,
                o,
                rel in DISTRACTOR_RELATIONS,
            )
        )
        facts[(s, rel)] = Fact(s, rel, o, pid)
    return World(seed, entities, facts, passages)
