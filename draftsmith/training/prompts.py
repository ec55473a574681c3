"""A reproducible training prompt set that never touches the evaluation sets in ``shared/data``.

Three sources, mixed by a seeded generator: instructions assembled from templates and topics,
procedurally generated arithmetic word problems (fresh numbers and names, not GSM8K items), and
code tasks built around passages of the Python standard library that ship with the interpreter.
The same ``(seed, count)`` always yields the same prompts on any machine with the same Python.
"""

from __future__ import annotations

import inspect
import json
import random
from collections.abc import Iterator
from pathlib import Path

TOPICS = (
    "photosynthesis", "the water cycle", "black holes", "compound interest", "the French Revolution",
    "vaccines", "plate tectonics", "machine learning", "the stock market", "climate change",
    "the human heart", "volcanoes", "electric cars", "the Roman Empire", "honey bees",
    "renewable energy", "the internet", "sleep", "coffee", "chess", "the moon landing",
    "recycling", "earthquakes", "the immune system", "jazz music", "bread baking", "rainbows",
    "gravity", "the printing press", "friendship", "time management", "public speaking",
    "healthy eating", "ocean tides", "the Olympic Games", "democracy", "inflation", "DNA",
    "solar panels", "bicycles", "mountain climbing", "the piano", "volunteering", "libraries",
    "magnets", "the speed of light", "dinosaurs", "rain forests", "budgeting", "gardening",
)
AUDIENCES = ("a ten-year-old", "a high-school student", "a busy manager", "a beginner",
             "an expert", "a grandparent")
INSTRUCTION_TEMPLATES = (
    "Explain {topic} to {audience}.",
    "Write a short paragraph about {topic}.",
    "Give three interesting facts about {topic}.",
    "What are the pros and cons of {topic}?",
    "Write a short poem about {topic}.",
    "Summarize the history of {topic} in a few sentences.",
    "How would you teach {topic} to {audience}? Give a plan.",
    "Write a friendly email to a colleague about {topic}.",
    "List five questions someone might ask about {topic}, and answer the first one.",
    "Compare {topic} and {other}. How are they alike and how do they differ?",
    "Write a short story for {audience} that involves {topic}.",
    "What are common misconceptions about {topic}?",
)
NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farah", "Gus", "Hana", "Ivan", "Jade", "Kofi",
         "Lena", "Mateo", "Nina", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara")
ITEMS = ("apples", "marbles", "stickers", "books", "cookies", "pencils", "coins", "cards",
         "flowers", "eggs", "toy cars", "shells")
CODE_TASKS = (
    "reverses a string", "checks whether a number is prime", "counts the vowels in a string",
    "returns the n-th Fibonacci number", "merges two sorted lists", "removes duplicates from a list "
    "while keeping order", "computes the factorial of n", "finds the largest element of a list",
    "checks whether a string is a palindrome", "flattens a nested list", "converts Celsius to "
    "Fahrenheit", "returns the word frequencies of a text", "computes the greatest common divisor "
    "of two numbers", "transposes a matrix given as a list of lists", "validates an email address "
    "with a simple rule", "groups a list of words by their first letter", "returns the running "
    "sum of a list", "implements binary search", "rotates a list by k positions",
    "parses a comma-separated line into fields",
)
STDLIB_MODULES = ("textwrap", "bisect", "heapq", "statistics", "fractions", "colorsys", "shlex",
                  "string", "functools", "calendar", "difflib", "glob", "fnmatch", "random")


def _instruction(rng: random.Random) -> str:
    topic, other = rng.sample(TOPICS, 2)
    return rng.choice(INSTRUCTION_TEMPLATES).format(
        topic=topic, other=other, audience=rng.choice(AUDIENCES)
    )


def _word_problem(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    x, y, z = rng.randint(3, 60), rng.randint(2, 25), rng.randint(2, 9)
    forms = (
        f"{a} has {x} {item}. {b} gives {a} {y} more, then {a} shares them equally among "
        f"{z} friends. How many {item} does each friend get, and how many are left over?",
        f"{a} buys {z} boxes of {item} with {y} {item} in each box and already had {x}. "
        f"How many {item} does {a} have now?",
        f"A shop sells {item} for ${z} each. {a} spends ${x * z} and {b} spends ${y * z}. "
        f"How many {item} did they buy together?",
        f"{a} reads {y} pages a day. The book has {x * y + z} pages. How many days does {a} "
        f"need to finish it?",
        f"{a} saves ${y} every week. After {z} weeks {a} spends ${x}. How much money is left?",
    )
    return rng.choice(forms) + " Think step by step."


def _stdlib_functions() -> list[tuple[str, str]]:
    import importlib

    found = []
    for name in STDLIB_MODULES:
        module = importlib.import_module(name)
        for fname, fn in sorted(vars(module).items()):
            if fname.startswith("_") or not inspect.isfunction(fn):
                continue
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            if 120 <= len(src) <= 1500:
                found.append((f"{name}.{fname}", src))
    return found


def _code_prompt(rng: random.Random, functions: list[tuple[str, str]]) -> str:
    if functions and rng.random() < 0.5:
        qualname, src = rng.choice(functions)
        return rng.choice((
            f"Explain what this Python function from `{qualname}` does:\n\n```python\n{src}```",
            f"Write unit tests for this function:\n\n```python\n{src}```",
            f"Suggest improvements to this code:\n\n```python\n{src}```",
        ))
    return rng.choice((
        "Write a Python function that {task}.",
        "Write a Python function that {task}, with a docstring and an example.",
        "Implement, in Python, a function that {task}. Explain your solution briefly.",
    )).format(task=rng.choice(CODE_TASKS))


def training_prompts(count: int, seed: int = 0) -> Iterator[str]:
    """Yield ``count`` distinct prompts, the same ones for the same ``(count, seed)``.

    Mix of draws: 45% instructions, 25% word problems, 30% code (repeats are redrawn).
    """
    rng = random.Random(seed)
    functions = _stdlib_functions()
    seen: set[str] = set()
    for _ in range(count * 20):
        if len(seen) == count:
            return
        roll = rng.random()
        if roll < 0.45:
            prompt = _instruction(rng)
        elif roll < 0.70:
            prompt = _word_problem(rng)
        else:
            prompt = _code_prompt(rng, functions)
        if prompt not in seen:
            seen.add(prompt)
            yield prompt


def write_prompts(path: Path, count: int, seed: int = 0) -> Path:
    """Write the prompt set as JSONL (``{"turns": [prompt]}``, the evaluation files' format)."""
    with path.open("w", encoding="utf-8") as fh:
        for prompt in training_prompts(count, seed):
            fh.write(json.dumps({"turns": [prompt]}) + "\n")
    return path


__all__ = ["training_prompts", "write_prompts"]
