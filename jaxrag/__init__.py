"""jaxrag. Importing it pins XLA:CPU's float math to what every x86-64 CPU computes alike (jaxrag/cpu_numerics.py)."""

from jaxrag import cpu_numerics as _cpu_numerics

_cpu_numerics.pin()
