"""Unique prompts of the three kinds router.yaml routes (math, code, general), for tests that need
traffic a gateway would see rather than a fixed list."""

from __future__ import annotations

import itertools
import random

MATH = ["solve {a}x + {b} = {c}", "what is the derivative of x^{a} + {b}x", "compute {a} times {b} and show the steps",
        "find the area of a circle with radius {a} cm", "integrate {a}x^2 from 0 to {b}",
        "what is {a} percent of {c}"]
CODE = ["write a python function that sorts a list of {a} {thing}", "my {lang} program crashes with a {err} at line {c}",
        "how do I read a json file in {lang}", "refactor this {lang} class with {a} methods into smaller ones",
        "write a unit test in {lang} for a function that parses {thing}"]
GENERAL = ["recommend a {genre} book for a {a} year old", "what should I cook with {food} and {food2}",
           "tell me a fun fact about {animal}", "plan a {a} day trip to {city}", "what is a good gift for my {who}"]
FILL = {"thing": ["dates", "names", "orders", "invoices", "emails"], "lang": ["python", "rust", "java", "go", "c++"],
        "err": ["null pointer exception", "segfault", "type error", "stack overflow"],
        "genre": ["mystery", "history", "science fiction", "poetry"], "food": ["rice", "eggs", "tofu", "spinach"],
        "food2": ["lemons", "garlic", "beans", "cheese"], "animal": ["octopuses", "owls", "otters", "bees"],
        "city": ["Lisbon", "Kyoto", "Oslo", "Lima"], "who": ["sister", "boss", "neighbour", "grandfather"]}


def prompts(n: int, seed: int) -> list[str]:
    """`n` unique prompts of the three kinds router.yaml routes, none sent before (by `seed`)."""
    rng, out = random.Random(seed), set()
    templates = list(itertools.chain(MATH, CODE, GENERAL))
    while len(out) < n:
        values = {k: rng.choice(v) for k, v in FILL.items()}
        out.add(rng.choice(templates).format(a=rng.randint(2, 99), b=rng.randint(2, 99), c=rng.randint(100, 999), **values))
    return sorted(out, key=lambda _: rng.random())
