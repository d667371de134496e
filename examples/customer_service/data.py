"""Deterministic generator of the support fixtures and ticket instances.

Every ticket has a hidden state (the customer's tier, the order's amount and
age, the issue); the fixtures are that state as the lookup tools see it, and
each instance's ground truth follows from the same state by the support
policy. The reference solver takes the other road (tool outputs -> policy),
and the tests check that both roads agree on every instance.

Labels are balanced by construction: in every split a quarter of the
tickets each end in refund, replace, escalate and deny, so no constant answer scores well.
Boundary cases are included on purpose (an order exactly ``window_days``
old is still inside the window; an amount equal to the refund limit is
still refundable).

Regenerate the committed files with ``python -m examples.customer_service``
(``--check`` only compares).
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .._datafiles import data_main, jsonl, read_split, split_instances, stale_paths, write_files

PACKAGE_DIR = Path(__file__).resolve().parent
SEED = 4242
SPLIT_SIZES: Mapping[str, int] = {"train": 80, "val": 20, "test": 20}

RESOLUTIONS = ("refund", "replace", "escalate", "deny")
REFUND_LIMITS: Mapping[str, int] = {"standard": 50, "gold": 150}  # tier -> largest refund an agent may issue


@dataclass(frozen=True)
class Policy:
    """What the support policy says for one issue: the remedy and how long the customer has to claim."""

    issue: str
    remedy: str  # "refund" | "replace"
    window_days: int


POLICIES: tuple[Policy, ...] = (
    Policy("damaged", "replace", 30),
    Policy("defective", "refund", 60),
    Policy("wrong_item", "replace", 30),
    Policy("missing_parts", "replace", 14),
    Policy("not_as_described", "refund", 14),
)
_POLICY = {p.issue: p for p in POLICIES}

ITEMS = ("kettle", "headphones", "desk lamp", "backpack", "blender", "keyboard", "jacket", "toaster", "monitor", "tent")
COMPLAINTS: Mapping[str, str] = {
    "damaged": "The {item} arrived broken.",
    "defective": "The {item} stopped working.",
    "wrong_item": "I got a different item, not the {item} I ordered.",
    "missing_parts": "The {item} came with parts missing.",
    "not_as_described": "The {item} is not what the listing described.",
}
N_CUSTOMERS = 48
BOUNDARY_SHARE = 0.25  # tickets whose deciding value sits exactly at the boundary


def case_id_for(order_id: str) -> str:
    """The support case id of an order: stable across processes (crc32, unlike hash())."""
    return f"CS{zlib.crc32(order_id.encode()) % 9000 + 1000}"


@dataclass(frozen=True)
class Customer:
    customer_id: str
    tier: str

    @property
    def refund_limit(self) -> int:
        return REFUND_LIMITS[self.tier]


@dataclass(frozen=True)
class Ticket:
    """The hidden truth about one ticket, from which fixtures and ground truth both follow."""

    ticket_id: str
    customer: Customer
    order_id: str
    item: str
    amount: int
    days_since_delivery: int
    issue: str


def resolution(ticket: Ticket) -> str:
    """The policy's decision for a ticket (the same rule the system prompt states)."""
    policy = _POLICY[ticket.issue]
    if ticket.days_since_delivery > policy.window_days:
        return "deny"
    if policy.remedy == "refund" and ticket.amount > ticket.customer.refund_limit:
        return "escalate"
    return policy.remedy


def ground_truth(ticket: Ticket) -> dict[str, Any]:
    """The three answer fields: resolution, the amount refunded (0 unless refund), the case id."""
    decided = resolution(ticket)
    return {
        "resolution": decided,
        "refund_amount": ticket.amount if decided == "refund" else 0,
        "case_id": case_id_for(ticket.order_id),
    }


def _ids(rng: random.Random, prefix: str, low: int, high: int, count: int, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        candidate = f"{prefix}{rng.randint(low, high)}"
        if candidate not in taken:
            taken.add(candidate)
            out.append(candidate)
    return out


def _customers(rng: random.Random, taken: set[str]) -> list[Customer]:
    tiers = ["standard", "gold"] * (N_CUSTOMERS // 2)
    rng.shuffle(tiers)
    return [Customer(cid, tier) for cid, tier in zip(_ids(rng, "C", 200, 999, N_CUSTOMERS, taken), tiers)]


def _ticket(rng: random.Random, target: str, customer: Customer, order_id: str, ticket_id: str) -> Ticket:
    """A ticket whose policy decision is ``target`` (amount and age drawn to fit, boundaries included)."""
    limit = customer.refund_limit
    if target in ("refund", "escalate"):
        policy = rng.choice([p for p in POLICIES if p.remedy == "refund"])
    elif target == "replace":
        policy = rng.choice([p for p in POLICIES if p.remedy == "replace"])
    else:
        policy = rng.choice(POLICIES)
    edge = rng.random() < BOUNDARY_SHARE  # a value right at the limit that decides the ticket
    if target == "deny":
        days = policy.window_days + (1 if edge else rng.randint(2, 40))
    else:
        days = policy.window_days if edge else rng.randint(1, policy.window_days - 1)
    if target == "refund":
        amount = limit if edge else rng.randint(10, limit - 1)
    elif target == "escalate":
        amount = limit + 1 if edge else rng.randint(limit + 2, limit + 200)
    else:
        amount = rng.randint(10, 300)
    return Ticket(ticket_id, customer, order_id, rng.choice(ITEMS), amount, days, policy.issue)


EXAMPLE_TICKET = Ticket("T0999", Customer("C100", "gold"), "O1000", "blender", 80, 20, "defective")
"""The worked example's ticket (a refund, so it shows every tool): in the fixtures, never an instance."""


def request_text(ticket: Ticket) -> str:
    """The ticket as the agent receives it."""
    complaint = COMPLAINTS[ticket.issue].format(item=ticket.item)
    return (f"Ticket {ticket.ticket_id}: customer {ticket.customer.customer_id}, order {ticket.order_id}, "
            f"issue {ticket.issue}. \"{complaint}\" Resolve it.")


def instance(ticket: Ticket, split: str, index: int) -> dict[str, Any]:
    """One task row: id, split, the ticket as prompt, the ground truth, the ids the ticket names."""
    return {
        "id": f"support-{split}-{index:03d}",
        "split": split,
        "prompt": request_text(ticket),
        "ground_truth": ground_truth(ticket),
        "data": {"ticket_id": ticket.ticket_id, "customer_id": ticket.customer.customer_id,
                 "order_id": ticket.order_id, "issue": ticket.issue},
    }


def tickets(seed: int = SEED) -> list[Ticket]:
    """Every instance's ticket, in split order (train, then val, then test)."""
    rng = random.Random(seed)
    total = sum(SPLIT_SIZES.values())
    taken = {EXAMPLE_TICKET.customer.customer_id, EXAMPLE_TICKET.order_id, EXAMPLE_TICKET.ticket_id}
    customers = _customers(rng, taken)
    orders = _ids(rng, "O", 2000, 9999, total, taken)
    ticket_ids = sorted(_ids(rng, "T", 1000, 1999, total, taken))
    targets: list[str] = []
    for size in SPLIT_SIZES.values():  # balanced within each split, not only overall
        split_targets = [RESOLUTIONS[i % len(RESOLUTIONS)] for i in range(size)]
        rng.shuffle(split_targets)
        targets += split_targets
    return [_ticket(rng, target, rng.choice(customers), order_id, ticket_id)
            for target, order_id, ticket_id in zip(targets, orders, ticket_ids)]


def _fixture_files(all_tickets: Sequence[Ticket], seed: int) -> dict[str, str]:
    customers = sorted({t.customer for t in all_tickets}, key=lambda c: c.customer_id)
    orders = sorted(all_tickets, key=lambda t: t.order_id)  # table order says nothing about splits
    return {
        "fixtures/customers.jsonl": jsonl([
            {"customer_id": c.customer_id, "tier": c.tier, "refund_limit": c.refund_limit} for c in customers]),
        "fixtures/orders.jsonl": jsonl([
            {"order_id": t.order_id, "customer_id": t.customer.customer_id, "item": t.item, "amount": t.amount,
             "days_since_delivery": t.days_since_delivery} for t in orders]),
        "fixtures/policies.jsonl": jsonl([
            {"issue": p.issue, "remedy": p.remedy, "window_days": p.window_days} for p in POLICIES]),
        "fixtures/meta.json": json.dumps(
            {"seed": seed, "customers": len(customers), "orders": len(orders),
             "example_ticket": EXAMPLE_TICKET.ticket_id}, indent=2) + "\n",
    }


def generate(seed: int = SEED) -> dict[str, str]:
    """Every committed data file as text, keyed by its path relative to this package."""
    all_tickets = tickets(seed)
    return {**_fixture_files([*all_tickets, EXAMPLE_TICKET], seed), **split_instances(all_tickets, SPLIT_SIZES, instance)}


def write(root: Path = PACKAGE_DIR, seed: int = SEED) -> list[Path]:
    """Write the generated files under ``root``; returns the paths written."""
    return write_files(generate(seed), root)


def stale_files(root: Path = PACKAGE_DIR, seed: int = SEED) -> list[str]:
    """The committed files that differ from what ``generate`` makes now (empty: up to date)."""
    return stale_paths(generate(seed), root)


def load_instances(split: str, root: Path = PACKAGE_DIR) -> list[dict[str, Any]]:
    """The committed instances of one split (train, val or test)."""
    return read_split(root, split, SPLIT_SIZES)


def example_instance() -> dict[str, Any]:
    """The worked example's row (same shape as an instance, split "example")."""
    return instance(EXAMPLE_TICKET, "example", 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the committed files, or with ``--check`` report whether they are up to date."""
    return data_main(argv, "examples.customer_service", write, stale_files)


__all__ = [
    "COMPLAINTS",
    "EXAMPLE_TICKET",
    "POLICIES",
    "REFUND_LIMITS",
    "RESOLUTIONS",
    "SEED",
    "SPLIT_SIZES",
    "Customer",
    "Policy",
    "Ticket",
    "case_id_for",
    "example_instance",
    "generate",
    "ground_truth",
    "instance",
    "load_instances",
    "main",
    "request_text",
    "resolution",
    "stale_files",
    "tickets",
    "write",
]
