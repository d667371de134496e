"""The bug templates: small Python modules with one wrong function, its fix, and inputs to test it on.

Each template writes one module (the buggy function and a correct sibling),
the fixed module (only the function's body differs), the bug report an
issue tracker would hold, and candidate inputs drawn from a seeded ``rng``.
Which inputs reveal the bug is not declared here: ``data`` runs both
versions on every input (with a step budget, since some bugs loop forever)
and keeps the ones that tell them apart as the hidden tests' core.

A theme names the module, the function and what its values mean, so
sixteen templates times four or five themes give distinct repositories.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

Args = tuple[Any, ...]


@dataclass(frozen=True)
class Theme:
    module: str
    function: str
    noun: str  # what the values are, for the docstrings and the report


@dataclass(frozen=True)
class Template:
    """One kind of bug: how to write the module (buggy or fixed) and what inputs to try."""

    name: str
    themes: tuple[Theme, ...]
    source: Callable[[Theme, random.Random, bool], str]  # (theme, rng, fixed) -> module text
    issue: Callable[[Theme], str]  # the bug report
    inputs: Callable[[random.Random], list[Args]]  # candidate inputs, visible and hidden drawn from them


def _module(doc: str, body: str) -> str:
    return f'"""{doc}"""\n\n\n{body.strip()}\n'


def _ints(rng: random.Random, n: int, low: int = -20, high: int = 50) -> list[int]:
    return [rng.randint(low, high) for _ in range(n)]


# ----------------------------------------------------------------------------- the templates


def _sum_first(theme: Theme, rng: random.Random, fixed: bool) -> str:
    stop = "min(n, len(values))" if fixed else "min(n, len(values)) - 1"
    return _module(f"Totals of {theme.noun}.", f'''
def {theme.function}(values, n):
    """The sum of the first n {theme.noun} in values (all of them when n is larger)."""
    total = 0
    for i in range({stop}):
        total += values[i]
    return total


def grand_total(values):
    """The sum of all {theme.noun}."""
    return sum(values)''')


def _clamp(theme: Theme, rng: random.Random, fixed: bool) -> str:
    return _module(f"Keeping {theme.noun} in range.", f'''
def {theme.function}(value, low, high):
    """value limited to [low, high]: low when below, high when above."""
    if value < low:
        return low
    if value > high:
        return {"high" if fixed else "low"}
    return value


def in_range(value, low, high):
    """True when low <= value <= high."""
    return low <= value <= high''')


def _leap(theme: Theme, rng: random.Random, fixed: bool) -> str:
    rule = "year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)" if fixed else "year % 4 == 0 and year % 100 != 0"
    return _module(f"Calendar helpers for {theme.noun}.", f'''
def {theme.function}(year):
    """True when year is a leap year of the Gregorian calendar."""
    return {rule}


def days_in_year(year, leap):
    """366 when leap is true, else 365."""
    return 366 if leap else 365''')


def _mean(theme: Theme, rng: random.Random, fixed: bool) -> str:
    body = ("    if not values:\n        return 0.0\n    return sum(values) / len(values)" if fixed
            else "    return sum(values) // len(values)")
    return _module(f"Statistics of {theme.noun}.", f'''
def {theme.function}(values):
    """The mean of the {theme.noun} in values; 0.0 when there are none."""
{body}


def spread(values):
    """The largest minus the smallest value (0 when there are none)."""
    return max(values) - min(values) if values else 0''')


def _vowels(theme: Theme, rng: random.Random, fixed: bool) -> str:
    test = "ch.lower() in VOWELS" if fixed else "ch in VOWELS"
    return _module(f"Text checks for {theme.noun}.", f'''
VOWELS = "aeiou"


def {theme.function}(text):
    """How many vowels (a, e, i, o, u, in either case) text holds."""
    return sum(1 for ch in text if {test})


def word_count(text):
    """How many whitespace-separated words text holds."""
    return len(text.split())''')


_PAIRS = ((3, 5, "Fizz", "Buzz"), (2, 7, "Ping", "Pong"), (3, 4, "Tick", "Tock"), (4, 5, "Foo", "Bar"),
          (2, 5, "Hip", "Hop"))


def _fizzbuzz(theme: Theme, rng: random.Random, fixed: bool) -> str:
    a, b, word_a, word_b = _PAIRS[rng.randrange(len(_PAIRS))]
    both = f'    if n % {a * b} == 0:\n        return "{word_a}{word_b}"\n'
    single = (f'    if n % {a} == 0:\n        return "{word_a}"\n'
              f'    if n % {b} == 0:\n        return "{word_b}"\n')
    body = both + single if fixed else single + both
    return _module(f"The {theme.noun} game.", f'''
def {theme.function}(n):
    """"{word_a}" for multiples of {a}, "{word_b}" for multiples of {b}, "{word_a}{word_b}" for multiples of both,
    otherwise n as text."""
{body}    return str(n)


def sequence(count):
    """The game's answers for 1 to count."""
    return [{theme.function}(n) for n in range(1, count + 1)]''')


def _merge(theme: Theme, rng: random.Random, fixed: bool) -> str:
    loop = "sorted(intervals)" if fixed else "intervals"
    return _module(f"Merging {theme.noun}.", f'''
def {theme.function}(intervals):
    """Merge overlapping [start, end] {theme.noun} (given in any order); the result is sorted by start."""
    merged = []
    for start, end in {loop}:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def total_length(intervals):
    """The summed length of the intervals (end - start each)."""
    return sum(end - start for start, end in intervals)''')


def _bsearch(theme: Theme, rng: random.Random, fixed: bool) -> str:
    step = "mid + 1" if fixed else "mid"
    return _module(f"Looking up {theme.noun}.", f'''
def {theme.function}(values, target):
    """The index of target in the sorted list values, or -1 when it is not there."""
    lo, hi = 0, len(values) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if values[mid] == target:
            return mid
        if values[mid] < target:
            lo = {step}
        else:
            hi = mid - 1
    return -1


def contains(values, target):
    """True when target is in values."""
    return target in values''')


def _chunk(theme: Theme, rng: random.Random, fixed: bool) -> str:
    stop = "len(items)" if fixed else "len(items) - size + 1"
    return _module(f"Batching {theme.noun}.", f'''
def {theme.function}(items, size):
    """items split into lists of size each, in order; the last list may be shorter."""
    return [items[i:i + size] for i in range(0, {stop}, size)]


def batch_count(items, size):
    """How many batches {theme.function} makes."""
    return -(-len(items) // size)''')


_SEPARATORS = (";", ",", "&", "|")


def _parse_pairs(theme: Theme, rng: random.Random, fixed: bool) -> str:
    sep = _SEPARATORS[rng.randrange(len(_SEPARATORS))]
    store = "result[key.strip()] = value.strip()" if fixed else "result[key] = value"
    return _module(f"Reading {theme.noun}.", f'''
SEPARATOR = "{sep}"


def {theme.function}(text):
    """The "key=value" pairs of text, separated by SEPARATOR, as a dict; spaces around keys and values are
    ignored, and empty parts are skipped."""
    result = {{}}
    for part in text.split(SEPARATOR):
        if not part.strip():
            continue
        key, value = part.split("=", 1)
        {store}
    return result


def render(pairs):
    """The dict as text {theme.function} reads back."""
    return SEPARATOR.join(f"{{key}}={{value}}" for key, value in pairs.items())''')


def _dedupe(theme: Theme, rng: random.Random, fixed: bool) -> str:
    body = ("    seen = set()\n    out = []\n    for item in items:\n        if item not in seen:\n"
            "            seen.add(item)\n            out.append(item)\n    return out") if fixed \
        else "    return list(set(items))"
    return _module(f"Cleaning lists of {theme.noun}.", f'''
def {theme.function}(items):
    """items without repeats, each kept where it first appears."""
{body}


def has_repeats(items):
    """True when some item appears more than once."""
    return len(set(items)) != len(items)''')


def _factorial(theme: Theme, rng: random.Random, fixed: bool) -> str:
    stop = "range(2, n + 1)" if fixed else "range(1, n)"
    return _module(f"Counting {theme.noun}.", f'''
def {theme.function}(n):
    """n! (the product 1 * 2 * ... * n) for n >= 0; 0! is 1."""
    result = 1
    for k in {stop}:
        result *= k
    return result


def choose(n, k):
    """The number of ways to choose k of n."""
    if not 0 <= k <= n:
        return 0
    return {theme.function}(n) // ({theme.function}(k) * {theme.function}(n - k))''')


def _palindrome(theme: Theme, rng: random.Random, fixed: bool) -> str:
    keep = "ch.lower() for ch in text if ch.isalnum()" if fixed else "ch for ch in text if ch.isalnum()"
    return _module(f"Checks on {theme.noun}.", f'''
def {theme.function}(text):
    """True when text reads the same backwards, ignoring case and every character but letters and digits."""
    cleaned = [{keep}]
    return cleaned == cleaned[::-1]


def reverse_words(text):
    """text with its words in reverse order."""
    return " ".join(reversed(text.split()))''')


def _second(theme: Theme, rng: random.Random, fixed: bool) -> str:
    source = "set(values)" if fixed else "values"
    return _module(f"Rankings of {theme.noun}.", f'''
def {theme.function}(values):
    """The second-largest distinct value of values, or None when there is none."""
    ordered = sorted({source}, reverse=True)
    return ordered[1] if len(ordered) > 1 else None


def largest(values):
    """The largest value, or None for no values."""
    return max(values) if values else None''')


def _fahrenheit(theme: Theme, rng: random.Random, fixed: bool) -> str:
    value = "round(celsius * 9 / 5 + 32, 1)" if fixed else "round(celsius * 9 / 5 + 32)"
    return _module(f"Units for {theme.noun}.", f'''
def {theme.function}(celsius):
    """Degrees Fahrenheit for degrees Celsius, rounded to one decimal."""
    return {value}


def to_kelvin(celsius):
    """Kelvin for degrees Celsius, rounded to two decimals."""
    return round(celsius + 273.15, 2)''')


def _frequencies(theme: Theme, rng: random.Random, fixed: bool) -> str:
    word = "word.lower()" if fixed else "word"
    return _module(f"Counting words in {theme.noun}.", f'''
def {theme.function}(text):
    """How often each word occurs in text, ignoring case (keys lower-case); words are split on whitespace."""
    counts = {{}}
    for word in text.split():
        key = {word}
        counts[key] = counts.get(key, 0) + 1
    return counts


def most_common(text):
    """The most frequent word of text (the first seen among ties), or None."""
    counts = {theme.function}(text)
    return max(counts, key=counts.get) if counts else None''')


# ----------------------------------------------------------------------------- inputs


def _sum_inputs(rng: random.Random) -> list[Args]:
    out = [(_ints(rng, k), n) for k, n in ((5, 3), (6, 6), (4, 10), (7, 1), (3, 2), (8, 5))]
    return out + [([], 3), ([rng.randint(1, 9)], 1), (_ints(rng, 5), 0)]


def _clamp_inputs(rng: random.Random) -> list[Args]:
    low, high = rng.randint(-10, 10), rng.randint(20, 60)
    return [(v, low, high) for v in (low - 5, low, (low + high) // 2, high, high + 1, high + 40, low - 100, high - 1)]


def _leap_inputs(rng: random.Random) -> list[Args]:
    years = [2000, 1900, 2024, 2023, 1600, 2100, 1996, 2400, rng.choice((1804, 1812, 1916)), rng.choice((1700, 1800))]
    return [(y,) for y in years]


def _mean_inputs(rng: random.Random) -> list[Args]:
    return [(_ints(rng, k, 0, 100),) for k in (3, 5, 8)] + [([],), ([1, 2],), ([2, 4, 6],), ([rng.randint(1, 9)] * 4,),
                                                            ([rng.randint(10, 99)],)]


def _vowel_inputs(rng: random.Random) -> list[Args]:
    texts = ["hello world", "AEIOU", "Sky", "Banana Bread", "rhythm", "An Old Oak", "queue", "EVERY evening"]
    rng.shuffle(texts)
    return [(t,) for t in texts]


def _fizz_inputs(rng: random.Random) -> list[Args]:
    return [(n,) for n in range(1, 41)]


def _merge_inputs(rng: random.Random) -> list[Args]:
    return [([[1, 3], [2, 6], [8, 10]],), ([[8, 10], [1, 3], [2, 6]],), ([[5, 7], [1, 2]],),
            ([[1, 4], [4, 5]],), ([],), ([[6, 8], [1, 9], [2, 3]],), ([[1, 2]],),
            ([[rng.randint(20, 25), 30], [10, rng.randint(12, 19)]],)]


def _bsearch_inputs(rng: random.Random) -> list[Args]:
    values = sorted(rng.sample(range(1, 100), 9))
    return [(values, values[0]), (values, values[4]), (values, values[-1]), (values, values[6]), (values, 0),
            (values, 100), ([], 5), ([values[2]], values[2]), (values, values[1])]


def _chunk_inputs(rng: random.Random) -> list[Args]:
    return [(list(range(1, n + 1)), size) for n, size in ((6, 2), (7, 3), (5, 5), (4, 3), (9, 4), (2, 5), (8, 8))]


def _pairs_inputs(rng: random.Random) -> list[Args]:
    return [("a=1{s}b=2",), ("name = Ada {s} role= admin",), ("x=1",), ("",), (" k = v {s}{s} z=9 ",),
            ("path=/tmp/x{s}mode=rw",), ("key=a=b",)]


def _dedupe_inputs(rng: random.Random) -> list[Args]:
    return [([3, 1, 3, 2, 1],), ([1, 2, 3],), ([5, 5, 5],), ([],), ([9, 8, 7, 8],), ([2, 1],),
            (rng.sample(range(10, 40), 6) * 2,)]


def _factorial_inputs(rng: random.Random) -> list[Args]:
    return [(n,) for n in (0, 1, 2, 3, 5, 6, 10, rng.randint(7, 12))]


def _palindrome_inputs(rng: random.Random) -> list[Args]:
    return [(t,) for t in ("racecar", "Racecar", "A man, a plan, a canal: Panama", "hello", "No lemon, no melon",
                           "ab", "", "Was it a car or a cat I saw?", "abca")]


def _second_inputs(rng: random.Random) -> list[Args]:
    return [([3, 1, 2],), ([5, 5, 4],), ([7],), ([],), ([2, 2, 2],), ([9, 9, 8, 8],), (_ints(rng, 6),)]


def _fahrenheit_inputs(rng: random.Random) -> list[Args]:
    return [(c,) for c in (0, 100, -40, 37, 21.5, 20, rng.choice((36.6, 18.3, -3.3, 12.2)))]


def _frequency_inputs(rng: random.Random) -> list[Args]:
    return [("the cat the hat",), ("The the THE",), ("one",), ("",), ("Go go gadget Go",), ("a b a B",)]


def _parse_pairs_inputs(rng: random.Random) -> list[Args]:
    return _pairs_inputs(rng)


# ----------------------------------------------------------------------------- the family


def _themes(*rows: tuple[str, str, str]) -> tuple[Theme, ...]:
    return tuple(Theme(*row) for row in rows)


TEMPLATES: tuple[Template, ...] = (
    Template("sum_first", _themes(("inventory", "stock_of_first", "stock counts"),
                                  ("ledger", "sum_first_payments", "payments"),
                                  ("telemetry", "first_readings_total", "sensor readings"),
                                  ("scoreboard", "top_rounds_total", "round scores")),
             _sum_first, lambda t: f"`{t.function}(values, n)` leaves out the last of the first n {t.noun}: "
                                   "with [1, 2, 3] and n=2 it returns 1, not 3.", _sum_inputs),
    Template("clamp", _themes(("audio", "clamp_volume", "volume levels"), ("motors", "limit_speed", "motor speeds"),
                              ("thermostat", "bound_setpoint", "temperature setpoints"),
                              ("pricing", "cap_discount", "discount percentages")),
             _clamp, lambda t: f"`{t.function}` returns the lower bound for values above the upper bound.",
             _clamp_inputs),
    Template("leap_year", _themes(("calendar_utils", "is_leap_year", "dates"), ("payroll", "has_leap_day", "pay dates"),
                                  ("almanac", "leap", "almanac years"), ("billing", "is_long_year", "billing years")),
             _leap, lambda t: f"`{t.function}(2000)` is False, but 2000 was a leap year.", _leap_inputs),
    Template("mean", _themes(("grades", "average_grade", "grades"), ("latency", "mean_latency", "latencies"),
                             ("weather", "mean_rainfall", "rainfall amounts"),
                             ("survey", "average_rating", "ratings")),
             _mean, lambda t: f"`{t.function}([1, 2])` returns 1 instead of 1.5, and `{t.function}([])` raises "
                              "ZeroDivisionError instead of returning 0.0.",
             _mean_inputs),
    Template("vowels", _themes(("phonics", "count_vowels", "words"), ("captions", "vowel_count", "captions"),
                               ("lyrics", "vowels_in", "lyrics"), ("names", "count_name_vowels", "names")),
             _vowels, lambda t: f"`{t.function}('AEIOU')` returns 0; capital vowels are not counted.",
             _vowel_inputs),
    Template("fizzbuzz", _themes(("game", "fizzbuzz", "counting"), ("party_game", "shout", "party"),
                                 ("drill", "call_out", "drill"), ("classroom", "say_number", "classroom"),
                                 ("puzzle", "answer_for", "puzzle")),
             _fizzbuzz, lambda t: f"`{t.function}` never returns the combined word for multiples of both numbers.",
             _fizz_inputs),
    Template("merge_intervals", _themes(("booking", "merge_bookings", "bookings"),
                                        ("shifts", "merge_shifts", "work shifts"),
                                        ("genome", "merge_regions", "genome regions"),
                                        ("schedule", "merge_meetings", "meetings")),
             _merge, lambda t: f"`{t.function}` misses overlaps when the intervals are not already sorted.",
             _merge_inputs),
    Template("binary_search", _themes(("catalog", "find_sku", "product codes"), ("index", "locate", "positions"),
                                      ("registry", "find_id", "member ids"),
                                      ("timeline", "find_timestamp", "timestamps")),
             _bsearch, lambda t: f"`{t.function}` never returns for some targets (it loops forever).",
             _bsearch_inputs),
    Template("chunk", _themes(("uploads", "batch_files", "files"), ("mailer", "split_recipients", "recipients"),
                              ("pages", "paginate", "page rows"), ("queue", "make_batches", "jobs")),
             _chunk, lambda t: f"`{t.function}` drops the last, shorter batch: 7 items in batches of 3 give 2 batches.",
             _chunk_inputs),
    Template("parse_pairs", _themes(("settings", "parse_settings", "settings"), ("cookies", "parse_cookie", "cookies"),
                                    ("querystring", "parse_query", "query parameters"),
                                    ("labels", "parse_labels", "labels")),
             _parse_pairs, lambda t: f"`{t.function}` keeps the spaces around keys and values.",
             _parse_pairs_inputs),
    Template("dedupe", _themes(("contacts", "unique_ids", "contact ids"), ("tags", "dedupe_tags", "tag ids"),
                               ("orders", "distinct_orders", "order numbers"),
                               ("visits", "first_visits", "visitor ids")),
             _dedupe, lambda t: f"`{t.function}` loses the order in which items first appear.", _dedupe_inputs),
    Template("factorial", _themes(("combinatorics", "factorial", "arrangements"),
                                  ("seating", "arrangements", "seatings"),
                                  ("lottery", "orderings", "draw orders"), ("routes", "permutations_of", "routes")),
             _factorial, lambda t: f"`{t.function}(3)` returns 2 instead of 6.", _factorial_inputs),
    Template("palindrome", _themes(("wordplay", "is_palindrome", "phrases"), ("puzzles", "reads_same", "puzzle words"),
                                   ("validators", "is_mirror_text", "inputs"),
                                   ("games", "palindromic", "game words")),
             _palindrome, lambda t: f"`{t.function}('Racecar')` is False; case should not matter.",
             _palindrome_inputs),
    Template("second_largest", _themes(("leaderboard", "runner_up", "scores"), ("auction", "second_bid", "bids"),
                                       ("exams", "second_best", "marks"), ("sales", "second_highest", "sales")),
             _second, lambda t: f"`{t.function}([5, 5, 4])` returns 5; it should be the second distinct value, 4.",
             _second_inputs),
    Template("fahrenheit", _themes(("forecast", "to_fahrenheit", "forecasts"), ("oven", "oven_fahrenheit", "ovens"),
                                   ("lab", "celsius_to_f", "lab readings"), ("travel", "fahrenheit_for", "trips")),
             _fahrenheit, lambda t: f"`{t.function}(37)` returns 99 instead of 98.6.", _fahrenheit_inputs),
    Template("word_frequencies", _themes(("reviews", "word_counts", "reviews"),
                                         ("articles", "term_frequencies", "articles"),
                                         ("chat", "count_words", "chat messages"),
                                         ("subtitles", "word_frequency", "subtitles")),
             _frequencies, lambda t: f"`{t.function}('The the')` counts 'The' and 'the' as different words.",
             _frequency_inputs),
)


def expand(template: Template, args: Args, separator: str | None) -> Args:
    """Inputs with the module's separator filled in (``parse_pairs`` writes ``{s}`` in its texts)."""
    if separator is None:
        return args
    return tuple(a.replace("{s}", separator) if isinstance(a, str) else a for a in args)


def separator_of(source: str) -> str | None:
    """The SEPARATOR a ``parse_pairs`` module defines, else None."""
    for line in source.splitlines():
        if line.startswith("SEPARATOR = "):
            return line.split("=", 1)[1].strip().strip('"')
    return None


def all_themes() -> Sequence[tuple[Template, Theme]]:
    return [(template, theme) for template in TEMPLATES for theme in template.themes]


__all__ = ["Args", "TEMPLATES", "Template", "Theme", "all_themes", "expand", "separator_of"]
