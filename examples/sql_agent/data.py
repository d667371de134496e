"""Deterministic generator of the company database rows and the question instances.

The rows (5 departments, 30 employees, 10 projects, their assignments) are
drawn from a seed; salaries and budgets are distinct so that "highest" has
one answer. Questions come from fourteen templates, each with its gold
query; a candidate is kept only when its gold result is informative (not
empty, not a lone 0 or NULL, which a wrong query could match by chance).

Regenerate the committed files with ``python -m examples.sql_agent``
(``--check`` only compares).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from .._datafiles import data_main, read_split, split_instances, stale_paths, write_files

from .database import build_env

PACKAGE_DIR = Path(__file__).resolve().parent
SEED = 3141
SPLIT_SIZES: Mapping[str, int] = {"train": 80, "val": 20, "test": 20}

DEPARTMENTS = (("Engineering", "Berlin"), ("Sales", "Lisbon"), ("Support", "Dublin"),
               ("Finance", "Oslo"), ("Research", "Kyoto"))
PEOPLE = ("Ada", "Bruno", "Chen", "Dara", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kemal", "Lena",
          "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wanda",
          "Xavier", "Yara", "Zane", "Amir", "Bea", "Carlos", "Dina")
PROJECTS = ("Apollo", "Borealis", "Comet", "Delta", "Ember", "Falcon", "Glacier", "Harbor", "Iris", "Juniper")
HIRE_YEARS = range(2014, 2025)

EXAMPLE_QUESTION = "How many employees were hired after 2020?"
EXAMPLE_SQL = "SELECT COUNT(*) FROM employees WHERE hire_year > 2020"
"""The first worked example (not a template's question, never an instance)."""
EXAMPLES = (  # the worked examples the prompt shows, in order: none is a template's question (see prompts.py)
    (EXAMPLE_QUESTION, EXAMPLE_SQL),
    ("Which projects does the Research department run?",
     "SELECT projects.name FROM projects JOIN departments ON projects.department_id = departments.id "
     "WHERE departments.name = 'Research'"),
    ("How many hours were logged on the Apollo project?",
     "SELECT SUM(hours) FROM projects JOIN assignments ON assignments.project_id = projects.id "
     "WHERE projects.name = 'Apollo'"),
)


def _spread(rng: random.Random, count: int, groups: int, at_least: int) -> list[int]:
    """A group id (1-based) for each of ``count`` items: every group gets ``at_least``, the rest at random.

    Uneven on purpose, so that "how many in X" has a different answer for different X.
    """
    ids = [g for g in range(1, groups + 1) for _ in range(at_least)]
    ids += [rng.randint(1, groups) for _ in range(count - len(ids))]
    rng.shuffle(ids)
    return ids


def generate_rows(rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    """Every table's rows, drawn from ``rng``."""
    departments = [{"id": i + 1, "name": n, "city": c} for i, (n, c) in enumerate(DEPARTMENTS)]
    dept_of = _spread(rng, len(PEOPLE), len(DEPARTMENTS), at_least=2)
    salaries = rng.sample(range(40_000, 130_000, 500), len(PEOPLE))
    employees = [{"id": i + 1, "name": name, "department_id": dept_of[i], "salary": salaries[i],
                  "hire_year": rng.choice(HIRE_YEARS)} for i, name in enumerate(PEOPLE)]
    budgets = rng.sample(range(20_000, 200_000, 1000), len(PROJECTS))
    project_dept = _spread(rng, len(PROJECTS), len(DEPARTMENTS), at_least=1)
    projects = [{"id": i + 1, "name": name, "department_id": project_dept[i], "budget": budgets[i]}
                for i, name in enumerate(PROJECTS)]
    assignments = []
    for employee in employees:
        for project_id in sorted(rng.sample(range(1, len(PROJECTS) + 1), rng.randint(1, 3))):
            assignments.append({"employee_id": employee["id"], "project_id": project_id,
                                "hours": rng.randint(2, 40) * 5})
    return {"departments": departments, "employees": employees, "projects": projects, "assignments": assignments}


@dataclass(frozen=True)
class Question:
    """One question with its gold query; ``ordered``: the answer's row order matters."""

    template: str
    text: str
    sql: str
    ordered: bool = False


_JOIN_DEPT = "employees JOIN departments ON employees.department_id = departments.id"
_JOIN_WORK = ("employees JOIN assignments ON assignments.employee_id = employees.id "
              "JOIN projects ON projects.id = assignments.project_id")


def _candidates(rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> Iterator[Question]:
    """Every question each template can ask of ``rows``."""
    depts = [d["name"] for d in rows["departments"]]
    cities = [d["city"] for d in rows["departments"]]
    people = [e["name"] for e in rows["employees"]]
    projects = [p["name"] for p in rows["projects"]]
    for d in depts:
        yield Question("count_in_department", f"How many employees work in {d}?",
                       f"SELECT COUNT(*) FROM {_JOIN_DEPT} WHERE departments.name = '{d}'")
        yield Question("average_salary", f"What is the average salary in {d}?",
                       f"SELECT AVG(salary) FROM {_JOIN_DEPT} WHERE departments.name = '{d}'")
        yield Question("department_city", f"In which city is the {d} department?",
                       f"SELECT city FROM departments WHERE name = '{d}'")
        yield Question("department_budget", f"What is the total budget of the projects of {d}?",
                       "SELECT SUM(budget) FROM projects JOIN departments ON projects.department_id = departments.id "
                       f"WHERE departments.name = '{d}'")
        yield Question("project_count", f"How many projects does {d} run?",
                       "SELECT COUNT(*) FROM projects JOIN departments ON projects.department_id = departments.id "
                       f"WHERE departments.name = '{d}'")
        yield Question("top_earner", f"Who is the highest-paid employee in {d}?",
                       f"SELECT employees.name FROM {_JOIN_DEPT} WHERE departments.name = '{d}' "
                       "ORDER BY salary DESC LIMIT 1")
    for c in cities:
        yield Question("employees_in_city", f"Which employees work in {c}?",
                       f"SELECT employees.name FROM {_JOIN_DEPT} WHERE departments.city = '{c}'")
    for year in HIRE_YEARS:
        yield Question("hired_in_year", f"Which employees were hired in {year}?",
                       f"SELECT name FROM employees WHERE hire_year = {year}")
    for threshold in range(80_000, 125_000, 5_000):
        yield Question("earns_more", f"Which employees earn more than {threshold}?",
                       f"SELECT name FROM employees WHERE salary > {threshold}")
    for threshold in range(100_000, 180_000, 20_000):
        yield Question("big_projects", f"Which projects have a budget over {threshold}?",
                       f"SELECT name FROM projects WHERE budget > {threshold}")
    for n in (2, 3, 4, 5):
        yield Question("top_salaries", f"List the {n} highest-paid employees, highest first.",
                       f"SELECT name FROM employees ORDER BY salary DESC LIMIT {n}", ordered=True)
    for p in people:
        yield Question("hours_logged", f"How many hours has {p} logged in total?",
                       f"SELECT SUM(hours) FROM {_JOIN_WORK} WHERE employees.name = '{p}'")
        yield Question("projects_of", f"Which projects does {p} work on?",
                       f"SELECT projects.name FROM {_JOIN_WORK} WHERE employees.name = '{p}'")
    for p in projects:
        yield Question("members_of", f"Who works on the {p} project?",
                       f"SELECT employees.name FROM {_JOIN_WORK} WHERE projects.name = '{p}'")


def informative(result: Sequence[Sequence[Any]]) -> bool:
    """False for results a wrong query matches too easily: no rows, or one 0 / NULL."""
    if not result:
        return False
    return not (len(result) == 1 and len(result[0]) == 1 and result[0][0] in (0, None))


def select_questions(rows: Mapping[str, Any], rng: random.Random, total: int) -> list[Question]:
    """``total`` informative questions, spread over the templates round-robin, then shuffled."""
    env = build_env(rows, row_limit=1000)
    try:
        with env.open() as db:
            pools: dict[str, list[Question]] = {}
            for q in _candidates(rows):
                if informative(db.fetch_all(q.sql)):
                    pools.setdefault(q.template, []).append(q)
    finally:
        env.close()
    for pool in pools.values():
        rng.shuffle(pool)
    chosen: list[Question] = []
    while len(chosen) < total:
        before = len(chosen)
        for pool in pools.values():
            if pool and len(chosen) < total:
                chosen.append(pool.pop())
        if len(chosen) == before:
            raise ValueError(f"the templates give only {len(chosen)} informative questions; asked for {total}")
    rng.shuffle(chosen)
    return chosen


def instance(question: Question, split: str, index: int) -> dict[str, Any]:
    """One task row: the question as prompt; the gold query and whether order matters as ground truth."""
    return {
        "id": f"sql-{split}-{index:03d}",
        "split": split,
        "prompt": question.text,
        "ground_truth": {"sql": question.sql, "ordered": question.ordered},
        "data": {"template": question.template},
    }


def generate(seed: int = SEED) -> dict[str, str]:
    """Every committed data file as text, keyed by its path relative to this package."""
    rng = random.Random(seed)
    rows = generate_rows(rng)
    questions = select_questions(rows, rng, sum(SPLIT_SIZES.values()))
    files = {"db/rows.json": "{\n" + ",\n".join(
        f'  "{table}": [\n' + ",\n".join("    " + json.dumps(r) for r in table_rows) + "\n  ]"
        for table, table_rows in rows.items()) + "\n}\n"}
    return {**files, **split_instances(questions, SPLIT_SIZES, instance)}


def write(root: Path = PACKAGE_DIR, seed: int = SEED) -> list[Path]:
    """Write the generated files under ``root``; returns the paths written."""
    return write_files(generate(seed), root)


def stale_files(root: Path = PACKAGE_DIR, seed: int = SEED) -> list[str]:
    """The committed files that differ from what ``generate`` makes now (empty: up to date)."""
    return stale_paths(generate(seed), root)


def load_instances(split: str, root: Path = PACKAGE_DIR) -> list[dict[str, Any]]:
    """The committed instances of one split (train, val or test)."""
    return read_split(root, split, SPLIT_SIZES)


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the committed files, or with ``--check`` report whether they are up to date."""
    return data_main(argv, "examples.sql_agent", write, stale_files)


__all__ = [
    "EXAMPLE_QUESTION",
    "EXAMPLES",
    "EXAMPLE_SQL",
    "SEED",
    "SPLIT_SIZES",
    "Question",
    "generate",
    "generate_rows",
    "informative",
    "instance",
    "load_instances",
    "main",
    "select_questions",
    "stale_files",
    "write",
]
