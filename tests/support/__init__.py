"""What the tests share, in one place: fake backends and toy vectors (`fakes`), building and
sending ext_proc messages (`extproc`: the message builders, an in-process service harness, a
one-shot client), bounded waiting (`waiting`), and an in-process router (`inproc_router`). Test
modules import from here, never from each other."""
