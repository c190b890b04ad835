"""What each tierfs mount is told to prefetch, given ComfyUI's queue.

Contract:

- The planner tracks, per prompt id, the model files the prompt will load, per mount, in load
  order (see graph.prompt_models). :meth:`Planner.sync` is told the queue as it stands: the
  running prompt(s) first, then the queued ones in the order ComfyUI will run them; prompts no
  longer in it are forgotten.
- :meth:`Planner.plans` gives, per mount, the running prompt's models followed by the next
  queued prompts' models, deduplicated (first occurrence kept) and cut to what the daemon
  accepts (:data:`MAX_PLAN_FILES` files, :data:`MAX_PLAN_BYTES` bytes). A mount that had a plan
  and now has nothing planned gets an empty plan (which clears the daemon's).
- :func:`plan_command` is the exact text written to ``MNT/.tierfs/control``:
  ``plan\\nREL1\\nREL2\\n`` (``plan\\n`` alone clears). The daemon warms the first file not yet
  open now, each next one when the one before has been read and closed, never beyond its RAM
  budget; a plan larger than the budget is still sent whole. Nothing waits on a plan.
- Bounded: at most `max_prompts` prompts are tracked (the ones furthest back in the queue are
  dropped), and a prompt's list is cut at `max_models` files per mount.

Pure data structure: no I/O, no threads; callers serialize access (the hooks' worker thread).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

# What the daemon accepts in one plan (core/src/control.rs: MAX_PLAN_FILES, MAX_COMMAND_BYTES).
MAX_PLAN_FILES = 64
MAX_PLAN_BYTES = 16 * 1024


def plan_command(rels: Sequence[str]) -> bytes:
    """The control-file text for a plan of `rels` (paths relative to the mount root)."""
    return ("plan\n" + "".join(f"{rel}\n" for rel in rels)).encode("utf-8")


def expressible(rel: str) -> bool:
    """Whether `rel` survives the daemon's line format: one line, no surrounding blanks, not
    absolute, no `..`."""
    if not rel or rel != rel.strip() or "\n" in rel or "\r" in rel or "\0" in rel:
        return False
    if rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        return False
    return ".." not in rel.replace("\\", "/").split("/")


def bounded_plan(rels: Iterable[str], max_files: int = MAX_PLAN_FILES,
                 max_bytes: int = MAX_PLAN_BYTES) -> list[str]:
    """`rels` deduplicated (first kept), inexpressible ones dropped, cut to the daemon's limits."""
    out: list[str] = []
    seen: set[str] = set()
    size = len(plan_command([]))
    for rel in rels:
        if rel in seen or not expressible(rel):
            continue
        need = len(rel.encode("utf-8")) + 1
        if len(out) >= max_files or size + need > max_bytes:
            break
        seen.add(rel)
        out.append(rel)
        size += need
    return out


class Planner:
    """The queue's prompts and their models; see the module docstring."""

    def __init__(self, max_prompts: int = 32, max_models: int = MAX_PLAN_FILES):
        self.max_prompts = max_prompts
        self.max_models = max_models
        self._models: dict[str, dict[str, list[str]]] = {}  # prompt id -> root -> rels
        self._running: list[str] = []
        self._queued: list[str] = []
        self._sent: dict[str, list[str]] = {}  # root -> plan last sent

    def knows(self, prompt_id: str) -> bool:
        return prompt_id in self._models

    def set_models(self, prompt_id: str, models: Mapping[str, Sequence[str]]) -> None:
        """Record the models of `prompt_id`: {mount root: [relative paths in load order]}."""
        self._models[prompt_id] = {
            str(root): bounded_plan(rels, max_files=self.max_models)
            for root, rels in models.items()
        }
        self._trim()

    def sync(self, running: Sequence[str], queued: Sequence[str]) -> None:
        """The queue now: running prompt id(s), then queued ones in run order. Forgets the rest."""
        self._running = [p for p in dict.fromkeys(running) if isinstance(p, str)]
        self._queued = [p for p in dict.fromkeys(queued)
                        if isinstance(p, str) and p not in self._running]
        live = set(self._running) | set(self._queued)
        for pid in [p for p in self._models if p not in live]:
            del self._models[pid]
        self._trim()

    def _trim(self) -> None:
        """Keep at most max_prompts: the running ones, then the earliest queued."""
        keep = (self._running + self._queued)[: self.max_prompts]
        if len(self._models) > self.max_prompts:
            extra = [p for p in self._models if p not in keep]
            for pid in extra[: len(self._models) - self.max_prompts]:
                del self._models[pid]
        self._queued = [p for p in self._queued if p in keep]

    @property
    def tracked(self) -> list[str]:
        """Prompt ids whose models are known, running first then queue order."""
        return [p for p in self._running + self._queued if p in self._models]

    def missing(self) -> list[str]:
        """Prompt ids in the queue whose models are not known yet (running first)."""
        return [p for p in self._running + self._queued if p not in self._models]

    def plans(self) -> dict[str, list[str]]:
        """{mount root: plan} for every mount with something planned or a plan sent before."""
        merged: dict[str, list[str]] = {}
        for pid in self.tracked:
            for root, rels in self._models[pid].items():
                merged.setdefault(root, []).extend(rels)
        out = {root: bounded_plan(rels, max_files=self.max_models) for root, rels in merged.items()}
        for root in self._sent:
            out.setdefault(root, [])
        return out

    def changed(self) -> dict[str, list[str]]:
        """The plans that differ from what was last sent (see :meth:`mark_sent`)."""
        return {root: plan for root, plan in self.plans().items()
                if self._sent.get(root, None if plan else []) != plan}

    def mark_sent(self, root: str, plan: Sequence[str]) -> None:
        if plan:
            self._sent[root] = list(plan)
        else:
            self._sent.pop(root, None)

    def forget_mount(self, root: str) -> None:
        """The mount is gone: drop what was sent to it."""
        self._sent.pop(root, None)
