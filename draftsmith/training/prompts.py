"""A reproducible training prompt set that never touches the evaluation sets in ``shared/data``.

Three sources, mixed by a seeded generator: instructions assembled from templates and topics,
procedurally generated arithmetic word problems (fresh numbers and names, not GSM8K items), and
code tasks built around passages of the Python standard library that ship with the interpreter.
Some math and code prompts wear the instruction formats of common benchmark harnesses (a boxed
final answer; a solution that must pass the docstring's tests), so the target's responses in those
formats are in the data; the wrapped problems and stubs are never benchmark items.
The same ``(seed, count)`` always yields the same prompts on any machine with the same Python.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Iterator

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
# The instruction formats of common math and code benchmarks' harnesses (chain of thought with a
# boxed answer; a solution that must pass the docstring's tests). They are prompt formats, not
# benchmark items: the questions and stubs they wrap are this module's own.
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
TESTED_SOLUTION = "Write a solution to the following problem and make sure that it passes the tests:"


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
    forms += (
        f"{a} is {x} years old. {b} is {z} years older than {a}. In {y} years, what will be the "
        f"sum of their ages?",
        f"A train travels {x * z} miles in {z} hours. At the same speed, how far does it travel "
        f"in {y} hours?",
        f"{a} had ${x * 10}. {a} spent {z * 5}% of it on {item} and ${y} on lunch. How much "
        f"money does {a} have left?",
        f"There are {x} {item} in a basket. {a} takes {min(y, x)} of them and {b} adds {z} "
        f"times as many as {a} took. How many {item} are in the basket now?",
        f"{a} works {z} hours a day for ${y} an hour, {min(x, 7)} days a week. How much does "
        f"{a} earn in {rng.randint(2, 6)} weeks?",
        f"A recipe needs {z} cups of flour for {y} cookies. How many cups are needed for "
        f"{y * rng.randint(2, 5)} cookies?",
    )
    c, d = rng.randint(2, 12), rng.randint(10, 90)
    forms += (
        f"{a} runs a lemonade stand. On Monday {a} sells {x} cups, on Tuesday {y} more than "
        f"on Monday, and on Wednesday half as many as on Tuesday. Each cup costs ${z}. How much "
        f"money does {a} make over the three days?",
        f"A class has {x + 10} students. {d}% of them walk to school, {c} ride bikes, and the "
        f"rest take the bus. How many students take the bus?",
        f"{a} wants to buy a bike that costs ${x * 10 + y}. {a} has saved ${x * 2} and earns "
        f"${z * 3} a week mowing lawns. How many weeks until {a} can afford the bike?",
        f"A garden is {x} feet long and {y} feet wide. {b} puts a fence around it and plants "
        f"{z} flowers per square foot in half of it. How many feet of fence and how many flowers "
        f"are needed?",
        f"{a} drives {x} miles to work and back every day, {min(z, 6)} days a week. The car uses "
        f"one gallon every {y + 10} miles and gas costs ${c} a gallon. What does {a} spend on "
        f"gas in {rng.randint(2, 5)} weeks?",
        f"A bakery makes {x * 4} muffins. It sells {d}% of them in the morning and {c} in the "
        f"afternoon, and gives away the rest. How many muffins are given away?",
        f"{a} is reading a {x * 10}-page book. {a} read {y} pages on the first day and twice as "
        f"many each following day. On which day does {a} finish the book?",
        f"{b} has {x} dollars more than {a}. Together they have {2 * y + x} dollars. How much "
        f"does each of them have?",
        f"A tank holds {x * 10} liters. It is {d}% full and leaks {c} liters an hour while a "
        f"pump adds {z} liters an hour. How full is it after {y} hours?",
        f"{a} orders {z} pizzas at ${y} each and a {c}% tip on the total. {a} splits the bill "
        f"with {rng.randint(2, 6)} friends. How much does each person pay?",
    )
    tail = rng.choice(("", " Think step by step.", " Explain your reasoning.",
                       " Show your work and give the final answer.", " Answer with a number."))
    return rng.choice(forms) + (BOXED if rng.random() < 0.4 else tail)


PLACES = ("the farmers' market", "a bookstore", "the school fair", "a bakery", "the zoo",
          "a hardware store", "the library sale", "a toy shop", "the county fair", "a cafe")
VEHICLES = ("train", "bus", "car", "cyclist", "boat", "truck", "runner", "plane")


def _chain(rng: random.Random, opening: str, steps, fewest: int, most: int,
           questions: tuple[str, ...]) -> str:
    """``opening``, then ``fewest .. most`` distinct ``steps`` (callables that draw their own
    numbers) in random order, then one of ``questions``."""
    clauses = [opening] + [fn() for fn in rng.sample(steps, rng.randint(fewest, most))]
    return " ".join(clauses + [rng.choice(questions)])


def _count_chain(rng: random.Random) -> str:
    """A quantity followed through three to five changes (GSM-style bookkeeping)."""
    a, b, c = rng.sample(NAMES, 3)
    item = rng.choice(ITEMS)
    opening = f"{a} starts the week with {rng.randint(5, 90)} {item}."
    steps = (
        lambda: f"{b} gives {a} {rng.randint(2, 40)} more {item}.",
        lambda: f"{a} buys {rng.randint(2, 9)} packs of {item} with {rng.randint(3, 12)} in each "
                f"pack at {rng.choice(PLACES)}.",
        lambda: f"{a} gives {rng.randint(2, 6)} {item} to each of {rng.randint(2, 5)} friends.",
        lambda: f"On the way home {a} loses {rng.randint(1, 9)} of them.",
        lambda: f"Then {a} doubles the collection by trading with {c}.",
        lambda: f"{a} uses {rng.choice((10, 20, 25, 50))}% of the {item} for a school project.",
        lambda: f"{c} borrows a third of what {a} has and returns {rng.randint(1, 5)} the next day.",
        lambda: f"{a} sells {rng.randint(2, 15)} {item} for ${rng.randint(1, 6)} each.",
    )
    return _chain(rng, opening, steps, 3, 5, (
        f"How many {item} does {a} have at the end of the week?",
        f"How many {item} are left, and how much money did {a} make?",
        f"How many more {item} does {a} have than at the start?"))


def _money_chain(rng: random.Random) -> str:
    """Earnings, purchases, discounts and savings in a few steps."""
    a, b = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    opening = (f"{a} earns ${rng.randint(8, 30)} an hour and works {rng.randint(2, 9)} hours on "
               f"Saturday and {rng.randint(1, 8)} hours on Sunday.")
    steps = (
        lambda: f"{a} spends ${rng.randint(5, 60)} on groceries.",
        lambda: f"{a} buys {rng.randint(2, 8)} {item} that cost ${rng.randint(2, 15)} each, with "
                f"a {rng.choice((10, 20, 25))}% discount on the total.",
        lambda: f"{a} pays back the ${rng.randint(5, 40)} borrowed from {b}.",
        lambda: f"{a} puts half of what is left into a savings account.",
        lambda: f"{b} gives {a} ${rng.randint(5, 50)} for helping with the garden.",
        lambda: f"A {rng.choice((5, 8, 10))}% tax is taken from the weekend's pay.",
        lambda: f"{a} shares ${rng.randint(6, 30)} equally with {rng.randint(2, 3)} cousins.",
    )
    return _chain(rng, opening, steps, 2, 4, (
        f"How much money does {a} have left?",
        f"How much money does {a} end the weekend with?",
        "What is left after everything, in dollars?"))


def _rate_problem(rng: random.Random) -> str:
    """Rates, times and proportions."""
    v, w = rng.randint(20, 80), rng.randint(10, 70)
    t, u = rng.randint(2, 6), rng.randint(1, 5)
    a = rng.choice(NAMES)
    forms = (
        f"A {rng.choice(VEHICLES)} travels at {v} miles per hour for {t} hours and then at {w} "
        f"miles per hour for {u} hours. How far does it travel, and what is its average speed?",
        f"A pool holds {v * 100} gallons. One pump fills it at {w} gallons per minute and a second "
        f"pump at {u * 5} gallons per minute. How long do both pumps take to fill it?",
        f"{a} can paint a fence in {t} hours and a friend can paint it in {t + u} hours. How long "
        f"do they take working together?",
        f"A recipe for {t} people uses {v} grams of flour and {w} grams of sugar. How much of each "
        f"is needed for {t * u + 1} people?",
        f"{a} reads {w} pages an hour. A {v * 10}-page book has to be finished in {u + 1} days. "
        f"How many hours a day must {a} read?",
        f"A factory makes {v} toys an hour for {t} hours a day. {u * 5}% of them fail inspection. "
        f"How many good toys does it make in a {rng.randint(5, 7)}-day week?",
    )
    return rng.choice(forms)


ROLES = ("a travel guide", "a chef", "a history teacher", "a personal trainer", "a detective",
         "a startup founder", "a librarian", "a sports coach", "a doctor", "a poet",
         "an astronaut", "a museum curator")
CHAT_TEMPLATES = (
    "Pretend you are {role}. Answer this question in character: what do you think about {topic}?",
    "Write a persuasive essay about why {topic} matters.",
    "Draft a professional email asking your manager for feedback on a project about {topic}.",
    "Write a blog post about {topic} for {audience}.",
    "Imagine you are {role}. Describe a typical day in your life.",
    "Give me a step-by-step plan to learn about {topic} in one month.",
    "Write a haiku and a limerick about {topic}.",
    "Rewrite the following sentence to be more formal: '{topic} is super cool and everyone "
    "should care about it.'",
    "Explain the difference between {topic} and {other} using an analogy.",
    "What are five tips for {audience} who want to get into {topic}?",
    "Describe {topic} in exactly three sentences.",
    "If you could change one thing about {topic}, what would it be and why?",
    "Create a short dialogue between {role} and a student about {topic}.",
    "Summarize the main arguments for and against {topic} in a table.",
)
RIDDLES = (
    "If a shirt takes 3 hours to dry outside, how long do 9 shirts take if they dry at the "
    "same time?",
    "I have two coins that add up to 30 cents, and one of them is not a nickel. What are they?",
    "A bat and a ball cost $1.10 together. The bat costs $1.00 more than the ball. How much "
    "does the ball cost?",
    "Which is heavier, a kilogram of feathers or a kilogram of iron? Explain.",
    "If you are running a race and pass the person in second place, what place are you in?",
    "How many times can you subtract 5 from 25?",
    "A farmer has 17 sheep and all but 9 run away. How many are left?",
)


def _chat_prompt(rng: random.Random, passages: list[str]) -> str:
    roll = rng.random()
    if roll < 0.15:
        return rng.choice(RIDDLES)
    if roll < 0.35 and passages:
        passage = rng.choice(passages)
        return rng.choice((
            "Summarize the following text in two sentences:\n\n{p}",
            "Extract the key terms from this passage and explain each briefly:\n\n{p}",
            "Write three quiz questions based on this text:\n\n{p}",
            "Rewrite this passage for a beginner:\n\n{p}",
        )).format(p=passage)
    topic, other = rng.sample(TOPICS, 2)
    return rng.choice(CHAT_TEMPLATES).format(
        topic=topic, other=other, role=rng.choice(ROLES), audience=rng.choice(AUDIENCES))


def _passages() -> list[str]:
    """Paragraphs of the interpreter's own documentation topics (``pydoc_data``)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    out = []
    for key in sorted(topics):
        for para in topics[key].split("\n\n"):
            para = " ".join(para.split())
            if 200 <= len(para) <= 900:
                out.append(para)
    return out


_SKIP_MODULES = frozenset({
    "this", "antigravity", "idlelib", "tkinter", "turtle", "turtledemo", "webbrowser", "pydoc",
    "ensurepip", "venv", "lib2to3", "test", "unittest", "pdb", "tabnanny", "msilib", "winreg",
    "winsound", "msvcrt", "nturl2path", "_winapi", "xxsubtype", "sre_compile", "sre_parse",
    "sre_constants", "asyncio", "multiprocessing", "concurrent", "ctypes", "curses", "dbm",
    "sqlite3", "ssl", "readline", "crypt", "nis", "spwd", "ossaudiodev", "cgi", "cgitb",
})
"""Standard-library modules never imported by the recipe (side effects, platform, size)."""


def _stdlib_functions() -> list[tuple[str, str]]:
    """``(qualified name, source)`` of documented pure-Python stdlib functions, sorted."""
    import importlib
    import sys
    import warnings

    found = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in _SKIP_MODULES:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - platform-specific modules simply do not contribute
            continue
        for fname, fn in sorted(vars(module).items()):
            if (fname.startswith("_") or not inspect.isfunction(fn)
                    or getattr(fn, "__module__", None) != name or not fn.__doc__):
                continue
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            if 120 <= len(src) <= 2000:
                found.append((f"{name}.{fname}", src))
    return found


def _signature_stub(src: str) -> str | None:
    """The ``def`` line(s) and docstring of a function's source, body removed (HumanEval's form)."""
    import ast
    import textwrap

    try:
        node = ast.parse(textwrap.dedent(src)).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(node, ast.FunctionDef) or not node.body:
        return None
    first = node.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return None
    lines = textwrap.dedent(src).splitlines()
    return "\n".join(lines[: first.end_lineno]) + "\n"


STUBS = (
    ("count_evens", "nums: List[int]", "int", "Return how many numbers in nums are even.",
     ("count_evens([1, 2, 4])", "2")),
    ("longest_word", "text: str", "str", "Return the longest word of text (the first one on a tie).",
     ("longest_word('a bb ccc dd')", "'ccc'")),
    ("pairwise_sums", "xs: List[int]", "List[int]",
     "Return the sums of neighbouring elements of xs.", ("pairwise_sums([1, 2, 3])", "[3, 5]")),
    ("is_sorted", "xs: List[float]", "bool", "Check whether xs is in non-decreasing order.",
     ("is_sorted([1.0, 2.5, 2.5])", "True")),
    ("char_histogram", "s: str", "Dict[str, int]", "Count how often each character occurs in s.",
     ("char_histogram('aab')", "{'a': 2, 'b': 1}")),
    ("second_largest", "nums: List[int]", "Optional[int]",
     "Return the second largest distinct value of nums, or None if there is none.",
     ("second_largest([4, 1, 4, 3])", "3")),
    ("title_case", "sentence: str", "str", "Capitalise the first letter of every word.",
     ("title_case('hello big world')", "'Hello Big World'")),
    ("digit_sum", "n: int", "int", "Return the sum of the decimal digits of a non-negative n.",
     ("digit_sum(1234)", "10")),
    ("chunk", "xs: List[int], size: int", "List[List[int]]",
     "Split xs into consecutive chunks of the given size (the last may be shorter).",
     ("chunk([1, 2, 3, 4, 5], 2)", "[[1, 2], [3, 4], [5]]")),
    ("common_prefix", "words: List[str]", "str", "Return the longest common prefix of words.",
     ("common_prefix(['flow', 'flower', 'flight'])", "'fl'")),
    ("count_islands", "grid: List[List[int]]", "int",
     "Count groups of 1s connected horizontally or vertically in grid.",
     ("count_islands([[1, 0], [0, 1]])", "2")),
    ("run_length", "s: str", "List[Tuple[str, int]]",
     "Encode s as (character, run length) pairs.", ("run_length('aaab')", "[('a', 3), ('b', 1)]")),
    ("moving_average", "xs: List[float], k: int", "List[float]",
     "Return the averages of every window of k consecutive values.",
     ("moving_average([1.0, 2.0, 3.0], 2)", "[1.5, 2.5]")),
    ("balanced", "s: str", "bool", "Check whether the brackets ()[]{} in s are balanced.",
     ("balanced('([]{})')", "True")),
    ("to_binary", "n: int", "str", "Return the binary representation of n without a prefix.",
     ("to_binary(10)", "'1010'")),
    ("nth_prime", "n: int", "int", "Return the n-th prime number, counting from 1.",
     ("nth_prime(5)", "11")),
    ("swap_case", "s: str", "str", "Turn lower-case letters into upper case and vice versa.",
     ("swap_case('aBc')", "'AbC'")),
    ("merge_intervals", "intervals: List[Tuple[int, int]]", "List[Tuple[int, int]]",
     "Merge overlapping closed intervals and return them sorted.",
     ("merge_intervals([(1, 3), (2, 5), (7, 8)])", "[(1, 5), (7, 8)]")),
)
"""Original HumanEval-style stubs: ``(name, parameters, return type, summary, (call, result))``."""


def _stub_prompt(rng: random.Random) -> str:
    name, params, ret, summary, (call, result) = rng.choice(STUBS)
    stub = (f"from typing import Dict, List, Optional, Tuple\n\n\ndef {name}({params}) -> {ret}:\n"
            f'    """ {summary}\n    >>> {call}\n    {result}\n    """\n')
    if rng.random() < 0.5:
        return f"{TESTED_SOLUTION}\n```python\n{stub}\n```"
    return rng.choice((
        f"Solve this in Python; the examples in the docstring must hold:\n```python\n{stub}\n```",
        f"Finish the function below.\n```python\n{stub}```",
        f"{stub}",
    ))


def _code_prompt(rng: random.Random, functions: list[tuple[str, str]]) -> str:
    roll = rng.random()
    if roll < 0.3:
        return _stub_prompt(rng)
    if functions and roll < 0.55:
        qualname, src = rng.choice(functions)
        stub = _signature_stub(src)
        if stub is not None:
            if rng.random() < 0.4:
                return f"{TESTED_SOLUTION}\n```python\n{stub}\n```"
            return rng.choice((
                f"Complete the following Python function:\n\n```python\n{stub}```",
                f"{stub}",
                f"Write the body of this function so that it does what its docstring says."
                f"\n\n```python\n{stub}```",
                f"Implement this function; the code should be correct for every case its "
                f"docstring describes:\n```python\n{stub}\n```",
                f"Here is a function stub. Write a complete solution.\n```python\n{stub}\n```",
            ))
    if functions and roll < 0.8:
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

    Mix of draws: 15% instructions, 35% word problems (templated, or chains of three to five
    bookkeeping, money or rate steps), 30% code, 20% chat (writing, roleplay, reasoning,
    extraction over documentation passages); repeats are redrawn. The code and
    passage pools come from the running interpreter's standard library, so the recipe is fixed
    for a given Python version.
    """
    rng = random.Random(seed)
    functions = _stdlib_functions()
    passages = _passages()
    seen: set[str] = set()
    for _ in range(count * 20):
        if len(seen) == count:
            return
        roll = rng.random()
        if roll < 0.15:
            prompt = _instruction(rng)
        elif roll < 0.50:
            pick = rng.random()
            if pick < 0.4:
                prompt = _word_problem(rng)
            elif pick < 0.65:
                prompt = _count_chain(rng)
            elif pick < 0.85:
                prompt = _money_chain(rng)
            else:
                prompt = _rate_problem(rng)
            if pick >= 0.4:  # the templated problems carry their own tail
                prompt += (BOXED if rng.random() < 0.4 else
                           rng.choice(("", "", " Think step by step.", " Show your work.")))
        elif roll < 0.80:
            prompt = _code_prompt(rng, functions)
        else:
            prompt = _chat_prompt(rng, passages)
        if prompt not in seen:
            seen.add(prompt)
            yield prompt


__all__ = ["training_prompts"]
