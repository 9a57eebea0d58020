"""What the rehearsal of the paper-scale path (test_paper_path.py) stands in for: README's commands read from README
and docs/training.md, the datasets written small in their published formats, the stand-in policy's triples, the
stand-in assistant fitted to write wrong solutions, and the stand-in LLM judge behind an OpenAI-compatible endpoint.

The stand-ins are the tiny head_dim-32 Qwen2 models (what vLLM's CPU attention runs) of cooper/tiny: the
warm-started policy "tiny-sft-hd32", the random "tiny-hd32" classifier as VerifyRM's base, and "tiny-hd32" fitted
here for a few seconds to answer every rewrite prompt with one wrong solution. The judge is a rule behind the
endpoint (the completion's boxed answer against the reference), not a model: fitting a tiny model to judge even
twenty triples took minutes on a 2-core CPU, past this test's budget.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cooper.boxed import last_boxed
from cooper.tiny.task import Problem

FENCE = re.compile(r"^```bash\n(.*?)^```", flags=re.M | re.S)

WRONG_SOLUTION = "We compute it. The answer is \\boxed{-1}."
"""What the stand-in assistant writes for every rewrite prompt: wrong for every tiny-task problem (their answers are
never negative), so the verifier keeps it as a negative."""


def section_under(text: str, heading: str) -> str:
    """The text after the line `heading` up to the next heading (a line starting with `#` outside a code block)."""
    lines, fenced = [], False
    for line in text.split(heading, 1)[1].splitlines()[1:]:
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:
            break
        lines.append(line)
    return "\n".join(lines) + "\n"


def commands_under(text: str, heading: str, first_block_only: bool = True) -> list[list[str]]:
    """The `cooper ...` commands of the bash blocks under `heading` (up to the next heading), split as a shell would
    split them (continuations joined, comments dropped)."""
    blocks = FENCE.findall(section_under(text, heading))
    commands = []
    for block in blocks[:1] if first_block_only else blocks:
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0] == "cooper":
                commands.append(argv)
    return commands


def swapped(argv: Sequence[str], swaps: dict[str, str | None], extra: Sequence[str] = ()) -> list[str]:
    """`argv` with the value of each dotted override named in `swaps` replaced (None drops the override), a
    positional input named in `swaps` replaced too, and `extra` appended."""
    out = []
    for token in argv:
        key = token.split("=", 1)[0] if "=" in token else token
        if key not in swaps:
            out.append(token)
        elif swaps[key] is not None:
            out.append(f"{key}={swaps[key]}" if "=" in token else str(swaps[key]))
    return [*out, *extra]


# ----- the datasets, in the formats their publishers use -----


def _statement(question: str) -> tuple[str, str]:
    """SVAMP's split of a word problem: the body, then the question sentence."""
    body, _, ask = question.rpartition(". ")
    return body + ".", ask


def write_sources(root: Path, train: Sequence[Problem], test: Sequence[Problem]) -> None:
    """Every input the paper path's `cooper data` commands read, under `root`: GSM8K's JSON Lines (answer after
    ####), SVAMP's JSON array (Body, Question, Answer as a float), MATH-500's JSON Lines without `answer` (the last
    \\boxed{} of `solution`), OlympiadBench's JSON array (`final_answer`, a list of LaTeX) and Math Odyssey's JSON
    Lines ($...$ around the answer)."""

    def gsm8k(p: Problem) -> dict[str, str]:
        return {"question": p.question, "answer": p.solution.replace(f"The answer is \\boxed{{{p.answer}}}.",
                                                                     f"\n#### {p.answer}")}

    def lines(path: str, rows: Sequence[dict]) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("".join(json.dumps(r) + "\n" for r in rows))

    lines("gsm8k/train.jsonl", [gsm8k(p) for p in train])
    lines("gsm8k/test.jsonl", [gsm8k(p) for p in test])
    svamp = [{"ID": f"chal-{i}", "Body": _statement(p.question)[0], "Question": _statement(p.question)[1],
              "Answer": float(p.answer), "Type": "Addition"} for i, p in enumerate(test)]
    (root / "SVAMP.json").write_text(json.dumps(svamp))
    lines("MATH-500/test.jsonl", [{"problem": p.question, "solution": p.solution, "subject": "Prealgebra",
                                   "level": 1, "unique_id": f"test/prealgebra/{i}.json"} for i, p in enumerate(test)])
    olympiad = [{"id": 1000 + i, "question": p.question, "final_answer": [f"${p.answer}$"], "unit": None}
                for i, p in enumerate(test)]
    (root / "olympiadbench.json").write_text(json.dumps(olympiad))
    lines("math_odyssey.jsonl", [{"question_id": i, "question": p.question, "answer": f"${p.answer}$",
                                  "reasoning": p.solution, "label": "Algebra"} for i, p in enumerate(test)])


# ----- the stand-in models -----


def sample_triples(policy_dir: str, problems: Sequence[Problem], samples: int, max_new_tokens: int,
                   seed: int) -> list[dict[str, str]]:
    """(question, reference, completion) triples of the stand-in policy, sampled as its rollouts are (the paper's
    prompt in the chat template, temperature 1)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cooper.config import DataConfig

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    template = DataConfig().prompt_template
    torch.manual_seed(seed)
    triples = []
    for p in problems:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": template.replace("{question}", p.question)}],
                                               tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]] * samples)
        with torch.no_grad():
            out = model.generate(ids, do_sample=True, temperature=1.0, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id)
        for row in out[:, ids.shape[1]:]:
            triples.append({"question": p.question, "reference": p.answer,
                            "completion": tokenizer.decode(row, skip_special_tokens=True)})
    return triples


def fit_rewriter(base_dir: str, out: Path, problems: Sequence[Problem]) -> Path:
    """`base_dir`'s causal LM fitted to answer the rewrite prompt of any problem with WRONG_SOLUTION; saved to `out`.
    The prompts of a few problems suffice: the answer does not depend on them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cooper.services.generator.negatives import rewrite_messages

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    target = tokenizer(WRONG_SOLUTION + "<|im_end|>", add_special_tokens=False)["input_ids"]
    prompts = [tokenizer(tokenizer.apply_chat_template(rewrite_messages(p.question, p.solution), tokenize=False,
                                                       add_generation_prompt=True), add_special_tokens=False)["input_ids"]
               for p in problems]
    width = max(len(p) for p in prompts) + len(target)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    labels = torch.full((len(prompts), width), -100)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        end = len(prompt) + len(target)
        ids[row, :end] = torch.tensor(prompt + target)
        labels[row, len(prompt) : end] = torch.tensor(target)  # learn the answer, not the prompt
        mask[row, :end] = 1
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model's steps are mostly overhead, which a second thread only adds to
    try:
        loss = fit_steps(model, optimizer, ids, mask, labels)
    finally:
        torch.set_num_threads(threads)
    assert loss < 0.05, f"the stand-in assistant did not fit its answer (loss {loss:.3f})"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def fit_steps(model: Any, optimizer: Any, ids: Any, mask: Any, labels: Any) -> float:
    """AdamW steps until the loss is below 0.02 (at most 300); the last loss."""
    for _ in range(300):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.02:
            break
    return loss.item()


# ----- the stand-in judge -----

_JUDGED = re.compile(r"Reference answer:\n(.*?)\n\nSolution:\n(.*?)\n\nLook only at the final result", re.S)


def rule_judgment(reference: str, completion: str, misjudged: frozenset[str]) -> str:
    """The stand-in judge's reply: Yes when the completion's last boxed answer is the reference; a completion in
    `misjudged` gets the other verdict (a judge's mistake, which annotation must drop)."""
    right = last_boxed(completion) == reference
    if completion in misjudged:
        right = not right
    return f"The final result is compared with the reference.\nFinal Judgment: {'Yes' if right else 'No'}"


@contextmanager
def judge_endpoint(misjudged: frozenset[str] = frozenset()) -> Iterator[tuple[str, list[dict]]]:
    """An OpenAI-compatible /v1/chat/completions on loopback that judges by `rule_judgment`: its base URL, and the
    request bodies it received."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(body)
            found = _JUDGED.search(body["messages"][-1]["content"])
            reply = "I cannot tell." if found is None else rule_judgment(found[1], found[2], misjudged)
            data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                            "finish_reason": "stop"}]}).encode()
            self.send_response(200 if self.path == "/v1/chat/completions" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", received
    finally:
        server.shutdown()
        server.server_close()
