"""Deterministic generator of the bundled demo data sets (`trainers/data/demo_data/*.jsonl`).

The data is small and has a structure a tiny model can learn within a couple of hundred
optimizer steps: templated facts about made-up people (where they live, what they eat, their
colour), small additions, reversing spelled-out words and counting on. The same world backs
the three record shapes, so the tiny tokenizer (trained on all three files) fits each of them.

Run ``python -m trainers.data.make_demo_data`` to rewrite the files; the output only depends on
``--seed``, ``--samples`` and ``--label-noise``.

Every answer of the bundled files follows from its question, so a model can drive its loss
towards 0; real fine-tuning data cannot be predicted that well (a 7B model's SFT loss ends
near 1 nat per token). ``--label-noise P`` gives the data a floor of its own: each fact and
sum is, with probability P, answered with a random value of its kind (another person's
town, food or colour; a random sum), drawn from a generator of its own so that P = 0
writes the bundled files byte for byte. Reversing and counting stay exact.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainers.data.paths import DEMO_DATA_DIR, demo_data_path

SHAPES = ("text", "prompt_completion", "messages")

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z"]
_VOWELS = ["a", "e", "i", "o", "u"]
_CODAS = ["", "n", "r", "l", "s"]
_FOODS = ["plums", "rice", "soup", "figs", "bread", "beans", "pears", "cheese", "nuts", "eggs"]
_COLOURS = ["red", "blue", "green", "gold", "grey", "pink", "black", "white"]
_WORDS = (
    "cat dog sun map pen cup hat box fish tree bird lamp moon star frog door milk ship rain leaf"
    " salt wolf kite"
).split()
_SYSTEM_PROMPTS = ["Answer briefly.", "You are a helpful assistant."]


@dataclass(frozen=True)
class Person:
    """A made-up person with three facts a model can memorise."""

    name: str
    town: str
    food: str
    colour: str


@dataclass(frozen=True)
class LabelNoise:
    """Which answers are replaced by a random one of their kind.

    Attributes:
        share: Probability that a fact or a sum gets a random answer (0: none).
        rng: The generator of the replacements, apart from the records' own.
    """

    share: float
    rng: random.Random

    def hit(self) -> bool:
        """Whether the next answer is replaced (never draws when `share` is 0)."""
        return self.share > 0 and self.rng.random() < self.share


_EXACT = LabelNoise(0.0, random.Random(0))


@dataclass(frozen=True)
class QA:
    """One question with its short answer and the same content as a plain sentence."""

    question: str
    answer: str
    sentence: str


def _names(rng: random.Random, count: int, syllables: int) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
        names.add(("".join(parts) + rng.choice(_CODAS)).capitalize())
    return sorted(names)


def make_world(rng: random.Random, people: int = 40, towns: int = 12) -> list[Person]:
    """Draw the made-up people and their facts."""
    town_names = _names(rng, towns, 2)
    return [
        Person(name, rng.choice(town_names), rng.choice(_FOODS), rng.choice(_COLOURS))
        for name in _names(rng, people, 2)
    ]


def _fact(rng: random.Random, world: Sequence[Person], noise: LabelNoise = _EXACT) -> QA:
    p = rng.choice(world)
    kind = rng.randrange(3)
    a = noise.rng.choice(world) if noise.hit() else p  # whose fact answers
    if kind == 0:
        return QA(f"Where does {p.name} live?", f"In {a.town}.", f"{p.name} lives in {a.town}.")
    if kind == 1:
        return QA(f"What does {p.name} eat?", f"{a.food.capitalize()}.", f"{p.name} eats {a.food}.")
    return QA(
        f"What colour does {p.name} like?",
        f"{a.colour.capitalize()}.",
        f"{p.name} likes {a.colour}.",
    )


def _addition(rng: random.Random, world: Sequence[Person], noise: LabelNoise = _EXACT) -> QA:
    a, b = rng.randrange(20), rng.randrange(20)
    total = noise.rng.randrange(39) if noise.hit() else a + b
    return QA(f"{a} + {b} =", f"{total}", f"{a} plus {b} is {total}.")


def _reversal(rng: random.Random, world: Sequence[Person], noise: LabelNoise = _EXACT) -> QA:
    spelled = " ".join(rng.choice(_WORDS))
    backwards = spelled[::-1]
    return QA(f"Reverse: {spelled}", backwards, f"{spelled} reversed is {backwards}.")


def _counting(rng: random.Random, world: Sequence[Person], noise: LabelNoise = _EXACT) -> QA:
    start = rng.randrange(1, 30)
    run = " ".join(str(n) for n in range(start, start + 5))
    return QA(f"Count from {start}:", run, f"Counting from {start}: {run}.")


_TASKS: list[tuple[float, Callable[[random.Random, Sequence[Person], LabelNoise], QA]]] = [
    (0.4, _fact),
    (0.2, _addition),
    (0.2, _reversal),
    (0.2, _counting),
]


def _sample(rng: random.Random, world: Sequence[Person], noise: LabelNoise) -> QA:
    weights = [w for w, _ in _TASKS]
    task = rng.choices([t for _, t in _TASKS], weights=weights)[0]
    return task(rng, world, noise)


def text_record(
    rng: random.Random, world: Sequence[Person], noise: LabelNoise = _EXACT
) -> dict[str, object]:
    """A ``{"text": ...}`` record: one or two sentences."""
    sentences = [_sample(rng, world, noise).sentence for _ in range(rng.choice([1, 1, 2]))]
    return {"text": " ".join(sentences)}


def prompt_completion_record(
    rng: random.Random, world: Sequence[Person], noise: LabelNoise = _EXACT
) -> dict[str, object]:
    """A ``{"prompt": ..., "completion": ...}`` record; the completion starts with a space."""
    qa = _sample(rng, world, noise)
    return {"prompt": qa.question, "completion": " " + qa.answer}


def chat_record(
    rng: random.Random, world: Sequence[Person], noise: LabelNoise = _EXACT
) -> dict[str, object]:
    """A ``{"messages": [...]}`` record with one or two user/assistant exchanges."""
    messages: list[dict[str, str]] = []
    if rng.random() < 0.1:
        messages.append({"role": "system", "content": rng.choice(_SYSTEM_PROMPTS)})
    for _ in range(1 if rng.random() < 0.8 else 2):
        qa = _sample(rng, world, noise)
        messages.append({"role": "user", "content": qa.question})
        messages.append({"role": "assistant", "content": qa.answer})
    return {"messages": messages}


_RECORD_MAKERS: dict[
    str, Callable[[random.Random, Sequence[Person], LabelNoise], dict[str, object]]
] = {
    "text": text_record,
    "prompt_completion": prompt_completion_record,
    "messages": chat_record,
}


def write_demo_data(
    out_dir: Path = DEMO_DATA_DIR, *, samples: int = 3000, seed: int = 0, label_noise: float = 0.0
) -> list[Path]:
    """Write the three demo files into ``out_dir``.

    Args:
        out_dir: Folder to write ``text.jsonl``, ``prompt_completion.jsonl`` and ``chat.jsonl``.
        samples: Records per file.
        seed: Seed of the generator; the same seed gives byte-identical files.
        label_noise: Probability that a fact or a sum is answered at random (0: exact data,
            the bundled files).

    Returns:
        The paths written.

    Raises:
        ValueError: `label_noise` outside [0, 1].
    """
    if not 0.0 <= label_noise <= 1.0:
        raise ValueError(f"label_noise must lie in [0, 1] but got {label_noise}")
    out_dir.mkdir(parents=True, exist_ok=True)
    world = make_world(random.Random(seed))
    written = []
    for index, shape in enumerate(SHAPES):
        rng = random.Random(seed * 1000 + index + 1)
        noise = LabelNoise(label_noise, random.Random(seed * 1000 + index + 501))
        lines = [
            json.dumps(_RECORD_MAKERS[shape](rng, world, noise), separators=(",", ":"))
            for _ in range(samples)
        ]
        path = out_dir / demo_data_path(shape).name
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: rewrite the demo data files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEMO_DATA_DIR, help="output folder")
    parser.add_argument("--samples", type=int, default=3000, help="records per file")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument(
        "--label-noise", type=float, default=0.0,
        help="probability that a fact or a sum is answered at random (a loss floor of its own)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.samples < 1:
        print(f"error: --samples must be at least 1, but got {args.samples}", file=sys.stderr)
        return 2
    if not 0.0 <= args.label_noise <= 1.0:
        print(
            f"error: --label-noise must lie in [0, 1], but got {args.label_noise}",
            file=sys.stderr,
        )
        return 2
    paths = write_demo_data(
        args.out, samples=args.samples, seed=args.seed, label_noise=args.label_noise
    )
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
