"""jaxrag: agentic retrieval-augmented generation trained with process supervision, in JAX.

Importing it changes nothing in the process. `python -m jaxrag.main` pins XLA:CPU's float math to what every x86-64
CPU computes alike (jaxrag/cpu_numerics.py); a script of its own calls `jaxrag.cpu_numerics.pin()` for the same.
"""
