"""A Task's losses traced once at a fit's start and read as a graph.

Two silent mistakes of a hand-written `Task.compute_losses` show in the graph
of its losses, and nowhere else before training has gone wrong:

- a loss that broadcasts: targets of shape (B,) against predictions of shape
  (B, 1) make an elementwise op return (B, B), and the mean of that matrix
  trains every prediction towards the batch's mean target (Keras' compiled
  losses squeeze or expand one side first; a Task's own arithmetic does
  not);
- regularisation dropped: an objective that leaves out `model.losses`
  (kernel regularisers, `add_loss`), so the regulariser never acts.

The trace is one `tf.function` trace of `compute_losses` and the objectives
(no gradient, nothing run), at a batch size no static dimension of the data
or the weights has, so a dimension of that size in the graph is the batch.
Once per trainer; `SupervisedTask` (Keras' compiled losses, which add the
model's losses themselves) is not traced.
"""

import dataclasses
import logging
import os
import warnings

import tensorflow as tf

from tapeworks.engine.step import guards, replicas
from tapeworks.engine.step.task import SupervisedTask
from tapeworks.errors import CorrectnessWarning, warn

logger = logging.getLogger("tapeworks")

# Batch sizes for the trace: primes, so no product of small dimensions hides one.
BATCH_CANDIDATES = (37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103)

# Elementwise ops that broadcast their two inputs against each other.
BROADCASTING_OPS = frozenset({
    "AddV2", "Add", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "MulNoNan",
    "SquaredDifference", "Maximum", "Minimum", "Pow", "FloorDiv", "FloorMod", "Xdivy",
    "Xlogy", "Xlog1py", "Equal", "NotEqual", "Less", "LessEqual", "Greater",
    "GreaterEqual", "LogicalAnd", "LogicalOr", "Atan2", "SelectV2"})

# Frames of these are not the user's line (`_user_line`).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@dataclasses.dataclass
class Broadcast:
    """An elementwise op of the losses that crosses the batch with itself."""

    op_type: str
    op_name: str
    shapes: tuple      # the two inputs' shapes, then the output's, with "B" for the batch
    where: str         # "file.py:line" in the user's code, or ""


@dataclasses.dataclass
class DroppedTerm:
    """A regularisation loss that an update's objective does not include."""

    update: str
    owner: str         # the layer (weight regularisers) or model (`add_loss`)
    kind: str          # "kernel_regularizer"-like attribute, or "add_loss"
    model: str         # how compute_losses reaches the model: "self.net"


@dataclasses.dataclass
class RegularisationTerm:
    """One term of a trained model's `losses`, computed in the trace."""

    owner: str         # the layer (weight regularisers) or model (`add_loss`)
    kind: str          # "kernel_regularizer"-like, or "add_loss"
    tensor: object
    variables: set     # ids of the variables it regularises (add_loss: its model's)
    model: str         # how compute_losses reaches the model: "self.net"


@dataclasses.dataclass
class TracedLosses:
    """One trace of a task's losses: its graph, the batch size it was traced at, the tensors."""

    graph: object
    batch: int
    losses: dict
    objectives: list   # one tensor per update
    terms: list        # RegularisationTerm


def check_task_losses(state):
    """Warns about a broadcasting loss or dropped regularisation (call it once per trainer).

    `state`: the built `TrainingState` (its task, element spec and counters).
    Not under a replicated strategy: the trace runs alone, outside `strategy.run`.
    """
    if replicas.is_replicated(state.strategy):
        return
    for message in findings(state.task, state.element_spec, state.counters):
        warn(message, CorrectnessWarning, section="task-losses")


def findings(task, element_spec, counters):
    """The messages of `check_task_losses`, as a list of text (`explain` shows them).

    A `SupervisedTask` has none: Keras' compiled losses reshape and add
    `model.losses` themselves.
    """
    if isinstance(task, SupervisedTask):
        return []
    traced = trace(task, element_spec, counters)
    if traced is None:
        return []
    messages = []
    found = broadcasts(traced)
    if found:
        first = found[0]
        a, b, out = first.shapes
        where = f" at {first.where}" if first.where else ""
        more = f" (and {len(found) - 1} more such op(s))" if len(found) > 1 else ""
        messages.append(
            f"tapeworks: a loss of {type(task).__name__}.compute_losses broadcasts the batch "
            f"against itself: `{first.op_type}` (op `{first.op_name}`){where} combines "
            f"shapes {a} and {b} into {out}{more}, B being the batch, so every prediction "
            "is compared with every target and the loss averages a B x B matrix: the "
            "model learns the batch's mean. (Keras' compiled losses reshape one side "
            "first; a Task's own arithmetic does not.) Fix: give both the same shape, "
            "e.g. `pred = tf.squeeze(pred, -1)` or `y = tf.reshape(y, tf.shape(pred))` "
            "before combining them.")
    by_update = {}
    for term in dropped_regularisation(traced, task):
        by_update.setdefault(term.update, []).append(term)
    for update, terms in by_update.items():
        owners = ", ".join(dict.fromkeys(f"`{t.owner}` ({t.kind})" for t in terms))
        models = list(dict.fromkeys(f"{t.model}.losses" for t in terms))
        messages.append(
            f"tapeworks: update {update!r} trains layers with regularisation losses, but "
            f"its objective leaves them out: {owners}. `{' + '.join(models)}` is not part "
            "of the loss it differentiates, so the regularisers never act (a Task trains "
            "on what compute_losses returns; only Keras' compiled losses add "
            "`model.losses` themselves). Fix: add them to that loss in compute_losses, "
            f"e.g. `loss = loss + tf.add_n({models[0]})`.")
    return messages


def trace(task, element_spec, counters):
    """`TracedLosses` of one trace of the task's losses, or None when it cannot be traced.

    A diagnostic: any failure here is left for the real step to report.
    """
    specs = tf.nest.flatten(element_spec)
    if not specs or not all(isinstance(s, tf.TensorSpec) and s.shape.rank for s in specs):
        return None
    batch = distinct_batch_size(specs, task)
    spec = tf.nest.map_structure(
        lambda s: tf.TensorSpec([batch] + s.shape.as_list()[1:], s.dtype), element_spec)
    found = {}

    def losses_of(data):
        losses, _ = task.run_losses(data, training=True)
        found["objectives"] = [u.objective(losses, counters) for u in task.updates]
        found["losses"] = losses
        found["terms"] = regularisation_terms(task)
        return losses

    try:
        with guards.inside_step(), warnings.catch_warnings():
            # What the trace would warn about, the real step's trace says.
            warnings.simplefilter("ignore")
            graph = tf.function(losses_of, autograph=False).get_concrete_function(spec).graph
    except Exception as error:  # noqa: BLE001 - a diagnostic never stops a fit
        logger.debug("tapeworks: the losses' graph check skipped: %s", error)
        return None
    return TracedLosses(graph, batch, found["losses"], found["objectives"], found["terms"])


def distinct_batch_size(specs, task):
    """A batch size that no static dimension of the data or of the weights equals."""
    taken = {d for s in specs for d in s.shape.as_list() if d is not None}
    for model in task.models:
        for variable in model.weights:
            taken.update(int(d) for d in variable.shape)
    return next((b for b in BATCH_CANDIDATES if b not in taken), BATCH_CANDIDATES[-1])


def regularisation_terms(task):
    """A `RegularisationTerm` for each regularisation loss of the trained models.

    Called inside the trace, after the forward pass: weight regularisers
    are computed afresh (as `model.losses` does), `add_loss` terms are the
    forward's own tensors.
    """
    frozen = {id(m) for m in task.frozen_models}
    terms = []
    for model in task.models:
        if id(model) in frozen or not model.trainable:
            continue
        reached = next((f"self.{name}" for name, value in vars(task).items()
                        if value is model), model.name)
        regularised = 0
        for variable in model.trainable_weights:
            regularizer = getattr(variable, "regularizer", None)
            if regularizer is None:
                continue
            regularised += 1
            path = getattr(variable, "path", variable.name)
            layer = path.rsplit("/", 1)[0] if "/" in path else model.name
            name = path.rsplit("/", 1)[-1]
            terms.append(RegularisationTerm(layer, f"{name}_regularizer", regularizer(variable),
                                            {id(variable)}, reached))
        model_losses = list(model.losses)
        # Keras lists the `add_loss` terms first, then one term per regularised weight.
        own = {id(v) for v in model.trainable_variables}
        for tensor in model_losses[:len(model_losses) - regularised]:
            if tf.is_tensor(tensor):
                terms.append(RegularisationTerm(model.name, "add_loss", tensor, own, reached))
    return terms


# Broadcasts ---------------------------------------------------------------------------

def broadcasts(traced):
    """Elementwise ops that the losses depend on and that multiply the batch dimension.

    One input of lower rank whose first dimension is the batch, right-aligned
    against an input whose first dimension is the batch too and whose size
    at that position is 1: numpy's rules put the first input's batch on a
    new axis, and the output holds B x B pairs. (A pairwise matrix written on
    purpose expands both sides explicitly, `a[:, None] - b[None, :]`, and is
    not one of these.)
    """
    batch = traced.batch
    found = []
    for op in ancestor_ops(traced.graph, list(traced.losses.values()) + traced.objectives):
        if op.type not in BROADCASTING_OPS or len(op.inputs) < 2 or not op.outputs:
            continue
        inputs = [t.shape for t in op.inputs[-2:]]
        out = op.outputs[0].shape
        if any(s.rank is None for s in inputs) or out.rank is None:
            continue
        for small, big in (inputs, inputs[::-1]):
            if _crosses_batch(small.as_list(), big.as_list(), out.as_list(), batch):
                found.append(Broadcast(op.type, op.name, tuple(
                    _shape_text(s.as_list(), batch) for s in (*inputs, out)),
                    _user_line(op)))
                break
    return found


def _crosses_batch(small, big, out, batch):
    if not small or not big or len(small) >= len(big) or len(out) != len(big):
        return False
    axis = len(out) - len(small)    # where `small`'s first (batch) dimension lands
    return (small[0] == batch and big[0] == batch and big[axis] == 1
            and out[0] == batch and out[axis] == batch)


def _shape_text(shape, batch):
    parts = ["B" if d == batch else ("?" if d is None else str(d)) for d in shape]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _user_line(op):
    """"file.py:line" of the innermost frame of the op's creation outside the libraries."""
    for frame in reversed(getattr(op, "traceback", None) or []):
        filename = getattr(frame, "filename", None) or frame[0]
        lineno = getattr(frame, "lineno", None) or frame[1]
        path = os.path.abspath(filename)
        if not (path.startswith(_PACKAGE) or "site-packages" in path
                or "dist-packages" in path or filename.startswith("<")):
            return f"{os.path.basename(path)}:{lineno}"
    return ""


# Regularisation -----------------------------------------------------------------------

def dropped_regularisation(traced, task):
    """`DroppedTerm`s: regularisation losses of trained variables missing from their objective.

    A weight regulariser computed in the loss is another computation than
    the one this check makes, of the same ops on the same variable: the two
    are matched by structure (op types and inputs, constants by value,
    variables by their captured handle). An `add_loss` term is the same
    tensor.
    """
    if not traced.terms:
        return []
    signatures = structural_signatures(traced.graph)
    dropped = []
    for update, objective in zip(task.updates, traced.objectives):
        trained = {id(v) for v in update.variables()}
        # A model not called in this step keeps the `add_loss` tensors of its last
        # call, in another graph: not a term of this step.
        mine = [term for term in traced.terms if term.variables & trained
                and getattr(term.tensor, "graph", None) is traced.graph]
        if not mine:
            continue
        included = {signatures[t.ref()] for t in ancestor_tensors(traced.graph, [objective])
                    if t.ref() in signatures}
        for term in mine:
            if signatures.get(term.tensor.ref()) not in included:
                dropped.append(DroppedTerm(update.name, term.owner, term.kind, term.model))
    return dropped


def structural_signatures(graph):
    """`tensor.ref() -> int`: equal for tensors computed by the same ops from the same inputs.

    One pass over the graph in creation order (an op's inputs exist before
    it); placeholders (captured variables and inputs) are themselves,
    constants their values.
    """
    interned, signatures = {}, {}
    for op in graph.get_operations():
        if op.type == "Placeholder":
            base = ("placeholder", op.name)
        elif op.type == "Const":
            value = tf.make_ndarray(op.get_attr("value"))
            base = ("const", value.dtype.str, value.shape, value.tobytes())
        else:
            base = (op.type, tuple(signatures.get(t.ref(), ("unknown", t.name))
                                   for t in op.inputs))
        for index, tensor in enumerate(op.outputs):
            key = (base, index, tensor.dtype.name)
            signatures[tensor.ref()] = interned.setdefault(key, len(interned))
    return signatures


def ancestor_tensors(graph, tensors):
    """Every tensor of `graph` that `tensors` are computed from, themselves included."""
    seen, stack, found = set(), [t for t in tensors if tf.is_tensor(t)], []
    while stack:
        tensor = stack.pop()
        if getattr(tensor, "graph", None) is not graph or tensor.ref() in seen:
            continue
        seen.add(tensor.ref())
        found.append(tensor)
        stack.extend(tensor.op.inputs)
    return found


def ancestor_ops(graph, tensors):
    """The ops of `graph` that `tensors` depend on, in the order they were created."""
    names = {tensor.op.name for tensor in ancestor_tensors(graph, tensors)}
    return [op for op in graph.get_operations() if op.name in names]
