"""The answer comparisons a `Dataset` entry grades with: mathematical equivalence
(`math_equal`, math-verify), integers (`integer_equal`, AIME) and choice letters
(`choice_equal`, GPQA). `grade` (evals.questions.datasets) extracts a solution's answer with
the graph's own ``extract_answer`` (``nodes.answer``), so the graph and the grader agree on what
a solution answered, then calls its dataset's comparison.

Why math-verify runs in worker processes: its timeouts use ``signal.alarm``, which works only in
the main thread (in any other thread ``parse``/``verify`` raise ``ValueError``), and no Python
signal can interrupt one long C-level operation (a huge integer power inside sympy). A pebble
process pool (started on first use, reused) kills and replaces a worker whose comparison takes
longer than the time limit, so every comparison is bounded from any thread and a pathological
answer never hangs a run; inside the workers math-verify's own timeouts work as designed.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import re
import signal
import sys
import threading
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import TYPE_CHECKING

from mur.nodes.answer import extract_answer
from mur.nodes.extras import require

if TYPE_CHECKING:
    from pebble import ProcessPool

if sys.platform.startswith("linux"):  # the workers' memory cap (Linux alone has /proc)
    import resource

logger = logging.getLogger(__name__)

#: Seconds one ``math_equal`` comparison may take before it counts as "not equal".
DEFAULT_TIMEOUT_S = 10.0
#: Longer answers are compared as strings only: real answers are short, and sympy's time on
#: long LaTeX grows without bound.
MAX_ANSWER_CHARS = 1000
#: Extra address space (bytes) a worker may allocate after its imports (Linux only), so a
#: huge number fails with MemoryError instead of swapping the machine.
_WORKER_EXTRA_MEMORY = 2 * 1024**3
#: Comparisons that may run at once (one worker process each).
_POOL_SIZE = max(1, min(4, os.cpu_count() or 1))


class GradingUnavailableError(RuntimeError):
    """math-verify cannot run here (not installed, or its worker processes fail to start)."""


# --------------------------------------------------------------------------- AIME

# Wrappers that carry no meaning around an integer answer: \text{25}, \mathbf{25}, {25}.
_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf|boxed|displaystyle)\s*")
_AIME_INT = re.compile(r"[+-]?\d{1,12}(?:\.0*)?")


def parse_aime_int(text: str | None) -> int | None:
    """The integer an AIME answer states ("25", "025", "\\boxed{25}", "25.", "$25$"), or None:
    non-integers ("25.5", "1/2", "x") are never graded correct."""
    if not isinstance(text, str) or len(text) > 200:
        return None
    cleaned = extract_answer(text) or text
    cleaned = _WRAPPER.sub("", cleaned)
    cleaned = re.sub(r"[\s{}$]|\\[,;!]", "", cleaned).rstrip(".")
    if not _AIME_INT.fullmatch(cleaned):
        return None
    return int(cleaned.split(".", 1)[0])


def integer_equal(answer: str, gold: str) -> bool:
    """AIME: the answer states the gold integer ("025", "\\boxed{25}" for 25)."""
    predicted = parse_aime_int(answer)
    return predicted is not None and predicted == parse_aime_int(gold)


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


def choice_equal(answer: str, gold: str) -> bool:
    """GPQA: the answer's first standalone letter is the gold letter."""
    letter = parse_choice_letter(answer)
    return letter is not None and letter == gold.strip().upper()


# --------------------------------------------------------------------------- MATH


def math_equal(
    prediction: str | None, gold: str | None, *, timeout: float = DEFAULT_TIMEOUT_S
) -> bool:
    """True iff math-verify shows ``prediction`` equivalent to ``gold`` within ``timeout`` s.

    Both are answers without the surrounding solution (LaTeX or plain: "\\frac{1}{2}", "0.5",
    "(1, 2]"). Never raises on any input and never runs longer than about ``timeout`` seconds:
    unparsable, overlong (> ``MAX_ANSWER_CHARS``) or too slow answers count as not equal. Safe
    to call from any thread. Raises ``MissingExtra`` without the `lab` extra (math-verify and
    its worker pool), ``GradingUnavailableError`` when its workers cannot start.
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
    return _VERIFIER.equal(ref, pred, timeout)


def _strip_math(answer: str) -> str:
    """Drop whitespace and one pair of outer ``$``: the worker adds its own delimiters."""
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == "$" and answer[-1] == "$":
        answer = answer.strip("$").strip()
    return answer


def _squash(answer: str) -> str:
    return "".join(answer.split())


# --------------------------------------------------------------------------- workers


def _start_worker(extra_memory: int) -> None:
    """Runs once in each worker, before its first comparison: silent (math-verify logs and
    prints whole inputs, e.g. on a timeout; verdicts travel through pebble's pipes), with
    math-verify loaded, and a cap on the memory it may add after that. First, it lets go of the
    parent's signal wakeup socket (inherited at the fork when the parent runs an event loop
    that takes signals, as the benchmark runner does): else the SIGTERM that ends a worker
    over its time limit is written there and reaches the parent as a stop request."""
    signal.set_wakeup_fd(-1)
    logging.disable(logging.CRITICAL)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    # New stream objects: a thread of the parent may have held the old ones' locks at the fork.
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the worker's lifetime)
    # Local: only the workers load math-verify (and sympy), and before any time limit runs;
    # at the top it would add about half a second to every `mur solve` start (even --help).
    import math_verify  # noqa: F401, PLC0415

    if extra_memory > 0 and sys.platform.startswith("linux"):
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + extra_memory, resource.RLIM_INFINITY))


def _verify(gold: str, pred: str, seconds: int) -> bool:
    """In a worker: math-verify's verdict, its own (signal-based) timeouts as the first guard;
    the pool's timeout and kill are the second, for what signals cannot interrupt."""
    # Local: the parent never loads math-verify (see _start_worker, which did in this worker).
    from math_verify import parse, verify  # noqa: PLC0415
    from math_verify.errors import TimeoutException  # noqa: PLC0415

    try:
        g = parse("$" + gold + "$", parsing_timeout=seconds)
        p = parse("$" + pred + "$", parsing_timeout=seconds)
        return bool(g) and bool(p) and bool(verify(g, p, timeout_seconds=seconds))
    except (Exception, TimeoutException):
        return False  # unparsable, too slow or out of memory: not shown equal


class _Verifier:
    """The worker pool shared by all threads: up to ``size`` comparisons run at once.

    Workers are forked: a spawned or fork-server worker would run the caller's main module
    again (all of `mur solve`'s imports, or a script without a main guard), where a forked one
    starts in milliseconds and only loads math-verify. A forked child of this process builds a
    pool of its own. The price of forking: a worker forked (the pool replaces a killed one from
    its own thread) while another thread is inside `subprocess.Popen` inherits Popen's
    exec-status pipe, and Popen then waits until that worker exits. Start subprocesses before
    grading, or `close()` the pool first (it restarts on the next comparison).
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._pool: ProcessPool | None = None
        self._owner_pid = 0

    def _workers(self) -> ProcessPool:
        with self._lock:
            if self._pool is None or self._owner_pid != os.getpid():
                require("lab", "grading answers")
                from pebble import ProcessPool  # noqa: PLC0415

                self._pool = ProcessPool(
                    max_workers=self._size,
                    initializer=_start_worker,
                    initargs=(_WORKER_EXTRA_MEMORY,),
                    context=multiprocessing.get_context("fork"),
                )
                self._owner_pid = os.getpid()
            return self._pool

    def equal(self, gold: str, pred: str, timeout: float) -> bool:
        timeout = max(float(timeout), 0.1)
        # math-verify's own limits are whole seconds (signal.alarm); keep them inside ours.
        inner_s = max(1, int(timeout / 4))
        future = self._workers().schedule(_verify, args=(gold, pred, inner_s), timeout=timeout)
        from pebble import ProcessExpired  # noqa: PLC0415 (here since the pool is: the lab extra)

        try:
            return future.result()
        except FutureTimeoutError:
            logger.warning("math_equal: no verdict within %.1f s, counted as not equal", timeout)
        except ProcessExpired as exc:
            # The worker died on this input (e.g. out of memory); the pool replaces it.
            logger.warning("math_equal: a math-verify worker died on an answer (%s)", exc)
        except (OSError, RuntimeError) as exc:  # the pool itself could not start a worker
            raise GradingUnavailableError(
                f"math-verify worker processes do not start ({exc}); check that "
                f'`{sys.executable} -c "import math_verify"` works'
            ) from exc
        return False

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._owner_pid == os.getpid():
            pool.stop()
            pool.join(timeout=10)


_VERIFIER = _Verifier(_POOL_SIZE)
atexit.register(_VERIFIER.close)
