"""Grading of model answers against the benchmarks' gold answers.

``extract_answer`` is the graph's own (``nodes.answer``), so that the graph and the grader agree
on what a solution answered. MATH answers are compared for mathematical equivalence with
math-verify; AIME answers as integers; GPQA answers by choice letter.

Why math-verify runs in a helper process: its timeouts use ``signal.alarm``, which works only in
the main thread (in any other thread ``parse``/``verify`` raise ``ValueError``), and no Python
signal can interrupt one long C-level operation (a huge integer power inside sympy). Helper
processes (a small pool, started on first use and reused), killed and replaced when an answer
takes longer than the time limit, bound the time of every comparison from any thread and never
let a pathological answer hang a run; inside them math-verify's own timeouts work as designed.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time
from typing import IO

from evals.datasets import Problem
from nodes.answer import extract_answer

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_ANSWER_CHARS",
    "GradingUnavailableError",
    "extract_answer",
    "grade",
    "math_equal",
    "parse_aime_int",
    "parse_choice_letter",
]

logger = logging.getLogger(__name__)

#: Seconds one ``math_equal`` comparison may take before it counts as "not equal".
DEFAULT_TIMEOUT_S = 10.0
#: Longer answers are compared as strings only: real answers are short, and sympy's time on
#: long LaTeX grows without bound.
MAX_ANSWER_CHARS = 1000
#: Seconds the helper process may take to start (importing sympy is slow on a cold disk).
_STARTUP_TIMEOUT_S = 120.0
#: Extra address space (bytes) the helper may allocate after its imports (Linux only), so a
#: huge number fails with MemoryError instead of swapping the machine.
_WORKER_EXTRA_MEMORY = 2 * 1024**3
#: Comparisons that may run at once (one helper process each, started only when needed).
_POOL_SIZE = max(1, min(4, os.cpu_count() or 1))

_AIME_DATASETS = frozenset({"aime24", "aime25"})


class GradingUnavailableError(RuntimeError):
    """math-verify cannot run here (not installed, or its helper process failed to start)."""


# --------------------------------------------------------------------------- dispatch


def grade(problem: Problem, prediction: str | None) -> bool:
    """True iff ``prediction`` answers ``problem`` correctly.

    ``prediction`` is the extracted answer (``extract_answer``'s result, None when the model gave
    none). A whole solution works too: its answer is extracted first (where it states none, all
    of it is read as the answer, so pass None instead). AIME: compared as integers; GPQA: the
    first standalone choice letter; MATH-500: ``math_equal``.
    """
    if not isinstance(prediction, str):
        return False
    answer = extract_answer(prediction)
    if answer is None:
        answer = prediction
    if problem.dataset in _AIME_DATASETS:
        predicted = parse_aime_int(answer)
        return predicted is not None and predicted == parse_aime_int(problem.answer)
    if problem.dataset == "gpqa_diamond":
        letter = parse_choice_letter(answer)
        return letter is not None and letter == problem.answer.strip().upper()
    if problem.dataset == "math500":
        return math_equal(answer, problem.answer)
    raise ValueError(
        f"grade() does not know dataset {problem.dataset!r}; "
        "expected one of math500, aime24, aime25, gpqa_diamond"
    )


# --------------------------------------------------------------------------- AIME

# Wrappers that carry no meaning around an integer answer: \text{25}, \mathbf{25}, {25}.
_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf|boxed|displaystyle)\s*")
_AIME_INT = re.compile(r"[+-]?\d{1,12}(?:\.0*)?")


def parse_aime_int(text: str | None) -> int | None:
    """The integer an AIME answer states ("25", "025", "\\boxed{25}", "25.", "$25$"), or None.

    Non-integers ("25.5", "1/2", "x") give None, so they are never graded correct.
    """
    if not isinstance(text, str) or len(text) > 200:
        return None
    cleaned = extract_answer(text) or text
    cleaned = _WRAPPER.sub("", cleaned)
    cleaned = re.sub(r"[\s{}$]|\\[,;!]", "", cleaned).rstrip(".")
    if not _AIME_INT.fullmatch(cleaned):
        return None
    return int(cleaned.split(".", 1)[0])


# --------------------------------------------------------------------------- GPQA

_CHOICE_WRAPPER = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|boxed)\s*\{")
_STANDALONE_LETTER = re.compile(r"(?<![A-Za-z0-9_\\])([A-Da-d])(?![A-Za-z0-9_])")
_ARTICLE_A = re.compile(r"a\s+[A-Za-z]")


def parse_choice_letter(text: str | None) -> str | None:
    """The chosen GPQA letter ("B", "(b)", "B)", "\\boxed{B}", "B. <choice text>"), or None.

    The first standalone letter A-D, case-insensitive; a lowercase "a" used as the article
    ("a value of ...") is skipped.
    """
    if not isinstance(text, str):
        return None
    cleaned = _CHOICE_WRAPPER.sub("", text[:10_000]).replace("*", "")
    for match in _STANDALONE_LETTER.finditer(cleaned):
        letter = match.group(1)
        if letter == "a" and _ARTICLE_A.match(cleaned, match.start()):
            continue
        return letter.upper()
    return None


# --------------------------------------------------------------------------- MATH


def math_equal(
    prediction: str | None, gold: str | None, *, timeout: float = DEFAULT_TIMEOUT_S
) -> bool:
    """True iff math-verify shows ``prediction`` equivalent to ``gold`` within ``timeout`` s.

    Both are answers without the surrounding solution (LaTeX or plain: "\\frac{1}{2}", "0.5",
    "(1, 2]"). Never raises on any input and never runs longer than about ``timeout`` seconds:
    unparsable, overlong (> ``MAX_ANSWER_CHARS``) or too slow answers count as not equal. Safe
    to call from any thread. Raises ``GradingUnavailableError`` only when math-verify itself
    cannot run.
    """
    if not isinstance(prediction, str) or not isinstance(gold, str):
        return False
    pred, ref = _strip_math(prediction), _strip_math(gold)
    if not pred or not ref:
        return False
    if _squash(pred) == _squash(ref):
        return True
    if len(pred) > MAX_ANSWER_CHARS or len(ref) > MAX_ANSWER_CHARS:
        return False
    return _POOL.equal(ref, pred, timeout)


def _strip_math(answer: str) -> str:
    """Drop whitespace and one pair of outer ``$``: the helper adds its own delimiters."""
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == "$" and answer[-1] == "$":
        answer = answer.strip("$").strip()
    return answer


def _squash(answer: str) -> str:
    return "".join(answer.split())


# The helper process: reads one JSON request per line, answers one JSON line each. It keeps
# math-verify's own (signal-based, main-thread) timeouts as the first guard; the parent's
# deadline and kill are the second, for what signals cannot interrupt.
_WORKER_SOURCE = r"""
import json, logging, sys
reply = sys.stdout
sys.stdout = sys.stderr
logging.disable(logging.CRITICAL)  # math-verify logs the whole input on a timeout
try:
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException
except Exception as exc:
    reply.write("error " + json.dumps(type(exc).__name__ + ": " + str(exc)) + "\n")
    reply.flush()
    raise SystemExit(1)
extra = int(sys.argv[1])
if extra > 0 and sys.platform.startswith("linux"):
    import resource
    try:
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + extra, resource.RLIM_INFINITY))
    except (OSError, ValueError) as exc:
        print("memory limit not set:", exc, file=sys.stderr)
reply.write("ready\n")
reply.flush()
for line in sys.stdin:
    seq, equal = None, False
    try:
        seq, gold, pred, parse_s, verify_s = json.loads(line)
        g = parse("$" + gold + "$", parsing_timeout=parse_s)
        p = parse("$" + pred + "$", parsing_timeout=parse_s)
        equal = bool(g) and bool(p) and bool(verify(g, p, timeout_seconds=verify_s))
    except (Exception, TimeoutException):
        equal = False  # unparsable, too slow or out of memory: not shown equal
    reply.write(json.dumps([seq, equal]) + "\n")
    reply.flush()
"""


class _Worker:
    """One math-verify helper process; used by one thread at a time (the pool sees to it)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._seq = 0

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def equal(self, gold: str, pred: str, timeout: float) -> bool:
        # math-verify's own limits are whole seconds (signal.alarm); keep them inside ours.
        inner_s = max(1, int(timeout / 4))
        for attempt in (1, 2):
            proc = self._ensure_started()
            self._seq += 1
            request = json.dumps([self._seq, gold, pred, inner_s, inner_s]) + "\n"
            try:
                assert proc.stdin is not None
                proc.stdin.write(request)
                proc.stdin.flush()
            except OSError:
                # The helper died since the last call (killed from outside, or a crash):
                # start a new one and send this request again, once.
                self.stop()
                if attempt == 2:
                    raise GradingUnavailableError(
                        "the math-verify helper process exits as soon as it starts "
                        'comparing; run `python -c "import math_verify"` to see why'
                    ) from None
                continue
            return self._await(self._seq, timeout)
        return False

    def _await(self, seq: int, timeout: float) -> bool:
        """The helper's verdict on request ``seq``; False (and no helper) past the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._replies.get(timeout=remaining) if remaining > 0 else ""
            except queue.Empty:
                line = ""
            if line == "":  # out of time (real lines always end with a newline)
                logger.warning(
                    "math_equal: no verdict within %.1f s, counted as not equal; "
                    "restarting the math-verify helper",
                    timeout,
                )
                self.stop()
                return False
            if line is None:
                # End of output: the helper died on this input (e.g. out of memory).
                logger.warning("math_equal: the math-verify helper died on an answer; not equal")
                self.stop()
                return False
            try:
                reply_seq, equal = json.loads(line)
            except ValueError:
                continue  # not a verdict line; the verdict follows
            if reply_seq == seq:
                return bool(equal)

    def _ensure_started(self) -> subprocess.Popen[str]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self.stop()
        if importlib.util.find_spec("math_verify") is None:
            raise GradingUnavailableError(
                "math-verify is not installed; install it with `pip install math-verify` "
                "(it is a dependency of this project: `pip install -e .`)"
            )
        try:
            proc = subprocess.Popen(
                [sys.executable, "-P", "-c", _WORKER_SOURCE, str(_WORKER_EXTRA_MEMORY)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                encoding="ascii",
                errors="replace",
            )
        except OSError as exc:
            raise GradingUnavailableError(
                f"cannot start the math-verify helper process with {sys.executable!r}: {exc}"
            ) from exc
        replies: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(
            target=_pump, args=(proc.stdout, replies), name="math-verify-reader", daemon=True
        ).start()
        self._proc, self._replies = proc, replies
        try:
            first = replies.get(timeout=_STARTUP_TIMEOUT_S)
        except queue.Empty:
            first = None
        if first is None or first.strip() != "ready":
            self.stop()
            detail = first.strip() if first else "no answer"
            raise GradingUnavailableError(
                f"the math-verify helper process did not start ({detail}); "
                f'check that `{sys.executable} -c "import math_verify"` works'
            )
        return proc

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.warning("math-verify helper process %d did not exit after kill", proc.pid)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError as exc:  # a broken pipe on close changes nothing here
                    logger.debug("closing helper pipe: %s", exc)


class _Pool:
    """Helper processes shared by all threads: up to ``size`` comparisons run at once.

    Workers start lazily (a lone caller only ever starts one) and are reused; a worker that
    timed out is dropped and replaced on demand.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self.reset_after_fork()

    def equal(self, gold: str, pred: str, timeout: float) -> bool:
        with self._slots:
            with self._lock:
                worker = self._idle.pop() if self._idle else _Worker()
            try:
                return worker.equal(gold, pred, max(float(timeout), 0.1))
            finally:
                with self._lock:
                    self._idle.append(worker)

    def close(self) -> None:
        if self._owner_pid != os.getpid():
            return  # a forked child: the helpers belong to the parent
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()

    def reset_after_fork(self) -> None:
        """Fresh state; in a forked child the parent's helpers and locks are not ours."""
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self._size)
        self._idle: list[_Worker] = []
        self._owner_pid = os.getpid()


def _pump(stream: IO[str], replies: queue.Queue[str | None]) -> None:
    """Move the helper's output lines into ``replies``; None marks its end."""
    try:
        for line in stream:
            replies.put(line)
    except (OSError, ValueError) as exc:  # the pipe was closed under us by _stop
        logger.debug("math-verify reader stopped: %s", exc)
    finally:
        replies.put(None)


_POOL = _Pool(_POOL_SIZE)
atexit.register(_POOL.close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_POOL.reset_after_fork)
