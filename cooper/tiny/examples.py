"""A fixed set of correct worked solutions in the three answer styles, to measure and test negative generation.

48 come from the tiny arithmetic task, each written three ways (ending in `\\boxed{}`, in GSM8K's `#### x`, and in
"The answer is x."), and 16 are written by hand to cover what the tiny task lacks: GSM8K's `<<a*b=c>>`
calculator notes and thousands separators, fractions, decimals, negatives, roots, pi, units.
Every positive is correct against its reference under math-verify (the tests check it through the verifier).
"""

from __future__ import annotations

import re

from cooper.services.generator.negatives import NegativeTask
from cooper.tiny.task import make_split

HANDWRITTEN: list[tuple[str, str, str]] = [
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
     "clips did Natalia sell altogether in April and May?", "72",
     "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in "
     "April and May.\n#### 72"),
    ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she "
     "earn?", "10",
     "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10."
     "\n#### 10"),
    ("A shop sells 1,150 pens on Monday and 420 pens on Tuesday. How many pens did it sell?", "1570",
     "On the two days the shop sold 1,150 + 420 = 1,570 pens.\n#### 1,570"),
    ("What is $\\frac{1}{2} \\cdot \\frac{3}{4}$?", "\\frac{3}{8}",
     "Multiply the numerators and the denominators: $\\frac{1 \\cdot 3}{2 \\cdot 4} = \\frac{3}{8}$.\n"
     "The answer is $\\frac{3}{8}$."),
    ("Simplify $\\sqrt{50}$.", "5\\sqrt{2}",
     "We have $\\sqrt{50} = \\sqrt{25 \\cdot 2} = 5\\sqrt{2}$.\nTherefore the final answer is $\\boxed{5\\sqrt{2}}$."),
    ("Solve $2x + 6 = 0$.", "-3",
     "Subtract 6 from both sides: $2x = -6$.\nDivide by 2: $x = -3$.\nThe answer is $-3$."),
    ("A rope of 7.5 m is cut into 3 equal pieces. How long is each piece in metres?", "2.5",
     "Each piece is 7.5 / 3 = 2.5 m long.\nThe answer is 2.5."),
    ("What is the area of a circle of radius 3?", "9\\pi",
     "The area is $\\pi r^2 = \\pi \\cdot 3^2 = 9\\pi$.\nSo the area is $\\boxed{9\\pi}$."),
    ("Find $x$ if $x/4 = 7$.", "28",
     "Multiply both sides by 4: $x = 4 \\cdot 7 = 28$.\nThe answer is $\\boxed{28}$."),
    ("A train travels 240 km in 3 hours. What is its average speed in km/h?", "80",
     "Speed is distance over time: 240 / 3 = 80 km/h.\n#### 80"),
    ("What is 15% of 80?", "12",
     "15% of 80 is 0.15 * 80 = 12.\nThe answer is 12."),
    ("Compute $3^4 - 2^5$.", "49",
     "$3^4 = 81$ and $2^5 = 32$, so $3^4 - 2^5 = 81 - 32 = 49$.\n\\boxed{49}"),
    ("A rectangle is 6 cm long and 4 cm wide. What is its perimeter in cm?", "20",
     "The perimeter is 2 * (6 + 4) = 2 * 10 = 20 cm.\nThe answer is 20 cm."),
    ("The temperature was 4 degrees and fell by 9 degrees. What is it now?", "-5",
     "The new temperature is 4 - 9 = -5 degrees.\n#### -5"),
    ("Evaluate $\\frac{2}{3} + \\frac{1}{6}$.", "\\frac{5}{6}",
     "With a common denominator, $\\frac{4}{6} + \\frac{1}{6} = \\frac{5}{6}$.\n$\\boxed{\\frac{5}{6}}$"),
    ("Tickets cost $3.25 each. How much do 4 tickets cost?", "13",
     "Four tickets cost 4 * 3.25 = 13.00 dollars.\nThe answer is 13."),
]


def example_tasks(per_style: int = 16) -> list[NegativeTask]:
    """`per_style` tiny problems in each of the three styles, then the handwritten ones; ids name the style."""
    tasks: list[NegativeTask] = []
    for p in make_split(per_style, 0, "generator-examples"):
        work = re.search(r"We compute (.*?)\. The answer", p.solution)
        steps = work.group(1) if work else p.answer
        tasks.append(NegativeTask(f"boxed-{p.id}", p.question, p.answer, p.solution))
        tasks.append(NegativeTask(f"hashes-{p.id}", p.question, p.answer, f"We compute {steps}.\n#### {p.answer}"))
        tasks.append(NegativeTask(f"answer-is-{p.id}", p.question, p.answer,
                                  f"First, {steps}.\nThe answer is {p.answer}."))
    tasks += [NegativeTask(f"hand-{i}", q, a, s) for i, (q, a, s) in enumerate(HANDWRITTEN)]
    return tasks
