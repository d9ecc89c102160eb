"""What the tests share, in one place: fake backends and toy vectors (`fakes`), building and
sending ext_proc messages (`extproc`: the message builders, an in-process service harness, a
one-shot client), bounded waiting (`waiting`), an in-process router (`inproc_router`), bodies as
the server reads them (`bodies`), the integration stack's settings and probes (`stack`). Test
modules import from here, never from each other or from a conftest (which holds fixtures only)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
