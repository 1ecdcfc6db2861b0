"""Pydantic schemas of a task folder's YAML files (docs/tasks.md: the task contract).

``task.yaml`` -> :class:`TaskSpec`; ``guidance.yaml`` -> :class:`Guidance`;
``rubric.yaml`` -> :class:`Rubric`. Every model forbids unknown keys, so a typo in a task
file is an error that names the field instead of a silently ignored setting.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from d2kbench.tasks.formula import FormulaError, evaluate_formula, formula_names

DTYPES = (
    "bfloat16", "float16", "float32", "float64",
    "float8_e4m3fn", "float8_e5m2", "int8", "uint8", "int16", "int32", "int64", "bool",
)
Dtype = Literal[
    "bfloat16", "float16", "float32", "float64",
    "float8_e4m3fn", "float8_e5m2", "int8", "uint8", "int16", "int32", "int64", "bool",
]
Level = Literal["L1", "L2", "L3"]
LEVELS: tuple[str, ...] = ("L1", "L2", "L3")
_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _PerWorkloadDtype:
    """``dtype`` plus ``dtype_param``: the name of a workload parameter that, when a workload
    sets it, overrides ``dtype`` on that workload (e.g. smoke workloads in float16 where the
    registered ones are bfloat16, because the CPU interpreter has no bfloat16 arithmetic)."""

    if TYPE_CHECKING:  # fields of the pydantic models this mixin is combined with
        dtype: str
        dtype_param: str | None

    def dtype_for(self, workload: Workload | None) -> str:
        """The dtype name of this tensor on ``workload`` (``dtype`` unless ``dtype_param`` overrides it)."""
        if workload is not None and self.dtype_param and self.dtype_param in workload.params:
            return str(workload.params[self.dtype_param])
        return self.dtype


class TensorArg(_Strict, _PerWorkloadDtype):
    """One tensor argument of ``run``. ``shape`` names axes (or fixes sizes).

    ``count`` (an axis name) makes the argument a *tensor list*: a Python list of ``count``
    tensors, each of ``shape`` and its own allocation (storages that do not overlap), e.g. the
    partial outputs of the ranks of a simulated tensor-parallel group. Every element is checked
    like a tensor argument, perturbed by the sensitivity call like one, and must stay untouched;
    a tensor list cannot be ``mutable``.
    """

    name: str
    kind: Literal["tensor"]
    shape: list[str | int]
    dtype: Dtype
    dtype_param: str | None = None
    layout: str = "contiguous"
    mutable: bool = False
    count: str | None = None
    #: the closed interval ``[lo, hi]`` of values the operator is defined for (probabilities,
    #: temperatures, uniform draws): the harness's perturbations of this argument (the
    #: sensitivity call, the element changed before every CUDA-graph replay) draw new values
    #: inside it instead of moving an element by a multiple of the tensor's largest magnitude,
    #: which would leave the contract (a negative temperature, a top-p above 1). None: any finite
    #: value of the dtype is valid.
    value_range: tuple[float, float] | None = None
    description: str = ""

    @model_validator(mode="after")
    def _count(self) -> TensorArg:
        if self.count is not None and (not self.count.isidentifier() or self.mutable):
            raise ValueError(f"tensor {self.name!r}: 'count' needs an axis name, and a tensor list cannot be mutable")
        if self.value_range is not None and not self.value_range[0] < self.value_range[1]:
            raise ValueError(f"tensor {self.name!r}: value_range needs lo < hi, got {list(self.value_range)}")
        return self


class ScalarArg(_Strict):
    """One Python scalar argument of ``run`` (its value comes from the input generator).

    ``axis`` (int scalars only) binds the value to a workload axis of that name: the axis is
    then a size like any tensor axis (usable in shapes, strides and SOL formulas, e.g. the
    number of experts or a block size), and the harness checks that the value equals it.
    """

    name: str
    kind: Literal["int", "float", "bool"]
    axis: str | None = None
    description: str = ""

    @model_validator(mode="after")
    def _axis(self) -> ScalarArg:
        if self.axis is not None and (self.kind != "int" or not self.axis.isidentifier()):
            raise ValueError(f"scalar {self.name!r}: 'axis' needs kind int and an identifier name")
        return self


class Sample(_Strict):
    """Check only ``count`` secretly drawn indices along ``axis`` (for an expensive oracle)."""

    axis: str
    count: int = Field(ge=1)


class Tolerance(_Strict):
    """One numerical check of an output (or of a mutated input) against an expected value.

    metric:
      * ``rel_fro``: ``||out - exp||_F / ||exp||_F`` over the ``slice_dims`` axes (the whole
        tensor when empty), reported as the max over the remaining axes; passes when <= ``max``.
      * ``allclose``: ``|out - exp| <= atol + rtol * |exp|`` elementwise; passes when the
        fraction of violating elements is <= ``max_mismatch`` (0 by default).
      * ``exact``: bitwise equality.
      * ``ulp``: distance in representable values (units in the last place of the output's
        dtype; plain difference for integers): every element within ``max`` of the expected
        value, and the fraction of elements that differ at all <= ``max_mismatch`` (FP8 codes
        that may flip by one at rounding boundaries, integer outputs off by one, ...).
      * ``custom``: the task reference's ``check(inputs, outputs)`` decides (non-unique outputs);
        a ``check`` that accepts an ``output`` keyword is told which output is being checked.
      * ``unchanged`` (state checks only): every element of an in-place argument that the
        reference left bit-identical to the call's input must still be bit-identical after the
        solution's call (the canary slots of a state pool or a cache); elements the reference
        changed are left to the argument's other checks. With ``slice_dims``, whole slices are
        judged instead (a slot of a state pool that the reference rewrote is not "unchanged" even
        where a few of its new elements equal the old bits). Error: the fraction of such elements
        modified; passes when none is.
    against: ``reference`` (the native-precision ``run``) or ``oracle`` (``reference.oracle``).
    """

    against: Literal["reference", "oracle"] = "reference"
    metric: Literal["rel_fro", "allclose", "exact", "ulp", "custom", "unchanged"]
    slice_dims: list[str] = []
    max: float | None = None
    atol: float | None = None
    rtol: float | None = None
    max_mismatch: float = 0.0
    sample: Sample | None = None
    rationale: str

    @model_validator(mode="after")
    def _params(self) -> Tolerance:
        if self.metric == "rel_fro" and self.max is None:
            raise ValueError("metric rel_fro needs 'max'")
        if self.metric == "allclose" and (self.atol is None or self.rtol is None):
            raise ValueError("metric allclose needs 'atol' and 'rtol'")
        if self.metric == "ulp" and (self.max is None or self.max < 0 or self.max != int(self.max)):
            raise ValueError("metric ulp needs 'max', a whole number of units >= 0")
        if not self.rationale.strip():
            raise ValueError("a tolerance needs a one-line rationale")
        return self

    def widened(self, factor: float) -> Tolerance:
        """This check with its bound ``factor`` times wider (``factor`` >= 1).

        Scales ``max`` (rounded up to whole units for ``ulp``), ``atol``, ``rtol`` and
        ``max_mismatch`` (capped at 1); ``exact``, ``custom`` and ``unchanged`` have no bound to
        widen and come back as they are. Used for calls whose inputs lie off the workload's
        distribution (the sensitivity call, docs/integrity.md).
        """
        if factor < 1:
            raise ValueError(f"a tolerance is only widened (factor {factor} < 1)")
        if factor == 1 or self.metric in ("exact", "custom", "unchanged"):
            return self
        update: dict = {"max_mismatch": min(1.0, self.max_mismatch * factor)}
        if self.max is not None:
            update["max"] = float(math.ceil(self.max * factor)) if self.metric == "ulp" else self.max * factor
        if self.atol is not None:
            update["atol"] = self.atol * factor
        if self.rtol is not None:
            update["rtol"] = self.rtol * factor
        return self.model_copy(update=update)


class OutputSpec(_Strict, _PerWorkloadDtype):
    """One output of ``run`` (in order), with the checks it must pass.

    ``shape`` entries are axis names, fixed sizes or formulas of the axes (``"T * k + E"``).
    ``strides``, when given, is the required memory layout: one element stride per dimension
    (ints or formulas of the axes), checked on every returned tensor (dimensions of size 1 are
    exempt); a workload may override it (``Workload.strides``). Without it any layout passes.
    """

    name: str
    shape: list[str | int]
    dtype: Dtype
    dtype_param: str | None = None
    strides: list[str | int] | None = None
    checks: list[Tolerance] = Field(min_length=1)
    description: str = ""


class Workload(_Strict):
    """A registered (or smoke, or adversarial) input configuration.

    ``checks`` and ``strides`` override an output's checks and required layout on this
    workload; ``timing`` overrides the task's timing (e.g. CUDA graphs for a short call of a
    task whose other workloads run long enough for events).
    """

    id: str
    axes: dict[str, int]
    params: dict[str, str | int | float | bool] = {}
    source: str = ""
    correctness_only: bool = False
    checks: dict[str, list[Tolerance]] = {}
    strides: dict[str, list[str | int]] = {}
    timing: Timing | None = None
    #: what bounds this workload's speed, ``compute``, ``memory`` or ``latency`` (a call whose
    #: roofline time is below the launch floor); by default derived from the task's floor work
    #: model and the measured launch floor (d2kbench.scoring.sol.bound_of), set only to override
    bound: Literal["compute", "memory", "latency"] | None = None
    #: processes, one GPU each, that a *distributed* workload runs on (1: an ordinary workload).
    #: The single-process harness does not run a workload of several ranks: it reports it
    #: ``not_run`` with the reason (:func:`d2kbench.harness.evaluate.unrunnable`); a multi-GPU
    #: runner checks its ranks' outputs with :func:`d2kbench.checking.ranks.identical_across_ranks`.
    ranks: int = Field(default=1, ge=1)

    def checks_for(self, name: str, default: list[Tolerance]) -> list[Tolerance]:
        """The checks of output (or mutable argument) ``name`` on this workload."""
        return self.checks.get(name, default)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError(f"workload id {v!r} must match {_ID.pattern}")
        return v

    def values(self) -> dict:
        """Axis values and parameters merged, as ``make_inputs`` receives them."""
        return {**self.axes, **self.params}


class Timing(_Strict):
    """How latency is measured (docs/timing.md, "What is timed")."""

    mode: Literal["events", "graph"]
    rationale: str = ""


class WorkCounts(_Strict):
    """Work of one algorithm as formulas of the axes (Python arithmetic on axis names).

    ``tc_precision`` is the operand precision of the tensor-core FLOPs, which decides the peak
    rate they are bounded by: ``bf16`` (16-bit operands, the default) or ``fp8`` (FP8 operands,
    e.g. a block-scaled FP8 GEMM, whose tensor-core rate is twice the 16-bit one).
    """

    tc_flops: str = "0"
    tc_precision: Literal["bf16", "fp8"] = "bf16"
    fp32_flops: str = "0"
    bytes: str = "0"
    note: str = ""


class SolSpec(_Strict):
    """Speed-of-light counts: the reference algorithm's work plus lower-work variants.

    ``floor`` names the variant whose time is the roofline floor (the least work any known
    design needs); a measured time under it is physically implausible. ``solution_work`` maps
    the task's own solutions (``expert``, ...) to the work model they implement.
    """

    reference: WorkCounts
    variants: dict[str, WorkCounts] = {}
    floor: str = "reference"
    solution_work: dict[str, str] = {}

    @model_validator(mode="after")
    def _floor(self) -> SolSpec:
        for name in [self.floor, *self.solution_work.values()]:
            if name != "reference" and name not in self.variants:
                raise ValueError(f"work model {name!r} is neither 'reference' nor a variant")
        return self

    def work_of(self, solution: str) -> tuple[str, WorkCounts]:
        """The work model (name, counts) a task's own solution implements (default: reference),
        used to report its achieved TFLOP/s and TB/s."""
        name = self.solution_work.get(solution, "reference")
        return name, self.counts(name)

    def counts(self, name: str) -> WorkCounts:
        return self.reference if name == "reference" else self.variants[name]


class Forbidden(_Strict):
    """Operators and libraries a solution's ``run`` may not use (beyond the global rules)."""

    aten_ops: list[str] = []
    modules: list[str] = []
    note: str = ""


_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


class Alternative(_Strict):
    """What a user would run instead of writing the kernel (``task.yaml`` ``alternatives:``).

    An alternative is a comparator timed and checked like any solution (``alt:NAME`` on the
    command line), e.g. PyTorch SDPA with a named backend, or ``torch.compile`` of the reference.
    It is *trusted* code like ``reference.py``: it may use SDPA, cuBLAS or inductor, which the
    integrity rules forbid in solutions, and runs without integrity monitors.

    Exactly one of:
      * ``file``: a path relative to the task folder (conventionally ``alternatives/NAME.py``)
        defining ``run`` with exactly the reference's signature;
      * ``compile_reference: true``: the harness's ``torch.compile`` (default mode) of the
        reference's ``run`` (``d2kbench/harness/compiled_reference.py``); no file.

    ``devices``: where the alternative is what a user would run (an SDPA backend that exists on
    CUDA only is ``[cuda]``); evaluating it on another device is refused.
    """

    name: str
    description: str
    file: str | None = None
    compile_reference: bool = False
    devices: list[Literal["cpu", "cuda"]] = Field(default=["cpu", "cuda"], min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _SNAKE.match(v):
            raise ValueError(f"alternative name {v!r} must be snake_case")
        return v

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        if not v.strip() or "\n" in v.strip():
            raise ValueError("an alternative needs a one-line description (what a user would run)")
        return v.strip()

    @field_validator("file")
    @classmethod
    def _file(cls, v: str | None) -> str | None:
        if v is not None and (v.startswith("/") or ".." in v.split("/") or not v.endswith(".py")):
            raise ValueError(f"file {v!r} must be a .py path relative to the task folder, inside it")
        return v

    @field_validator("devices")
    @classmethod
    def _devices(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"devices {v} lists a device twice")
        return v

    @model_validator(mode="after")
    def _source(self) -> Alternative:
        if (self.file is None) == (not self.compile_reference):
            raise ValueError(f"alternative {self.name!r} needs exactly one of 'file' and 'compile_reference: true'")
        return self


def is_axis_name(dim: str | int) -> bool:
    """A shape entry that names an axis (an identifier), as opposed to a size or a formula."""
    return isinstance(dim, str) and dim.isidentifier()


def _check_dims(dims: list, axes: set[str], where: str, rank: int | None = None) -> None:
    """Shape or stride entries: ints >= 0, axis names, or formulas over ``axes``."""
    if rank is not None and len(dims) != rank:
        raise ValueError(f"{where}: {len(dims)} entries for {rank} dimensions")
    for d in dims:
        if isinstance(d, int):
            if d < 0:
                raise ValueError(f"{where}: negative size {d}")
        elif not is_axis_name(d):
            unknown = formula_names(d) - axes
            if unknown:
                raise ValueError(f"{where}: formula {d!r} uses unknown axes {sorted(unknown)}")


class TaskSpec(_Strict):
    """``task.yaml``: the single source of truth of one task."""

    id: str
    title: str
    category: Literal[
        "optimizer", "attention", "linear_attention", "moe", "quantization", "serving", "training"
    ]
    origin: list[str] = Field(min_length=1)
    description: str
    args: list[Annotated[TensorArg | ScalarArg, Field(discriminator="kind")]] = Field(min_length=1)
    #: what ``run`` returns, in order: one output bare, several as a tuple; empty only for an
    #: in-place operator (mutable args), whose run returns None or () (:meth:`returned_container`)
    outputs: list[OutputSpec] = []
    state_checks: dict[str, list[Tolerance]] = {}
    workloads: list[Workload] = Field(min_length=1)
    smoke_workloads: list[Workload] = Field(min_length=1)
    timing: Timing
    sol: SolSpec
    forbidden: Forbidden = Forbidden()
    alternatives: list[Alternative] = []
    #: axes a workload may set to 0 (a decode step without tokens, an empty batch); every other
    #: axis is a size >= 1, and no axis is negative
    empty_axes: list[str] = []
    timeout_s: float = Field(default=600.0, gt=0)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not re.match(r"^[a-z][a-z0-9_]*$", v):
            raise ValueError(f"task id {v!r} must be snake_case")
        return v

    @model_validator(mode="after")
    def _consistency(self) -> TaskSpec:
        names = [a.name for a in self.args] + [o.name for o in self.outputs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate argument/output names: {sorted(dup)}")
        axes = self.axis_names()
        for a in self.tensor_args():
            _check_dims(a.shape, axes, f"argument {a.name!r} shape")
        for o in self.outputs:
            for ax in o.shape:
                if is_axis_name(ax) and ax not in axes:
                    raise ValueError(f"output {o.name!r} uses axis {ax!r} that no tensor argument has")
            _check_dims(o.shape, axes, f"output {o.name!r} shape")
            if o.strides is not None:
                _check_dims(o.strides, axes, f"output {o.name!r} strides", len(o.shape))
            for t in o.checks:
                self._check_axes(t, o.shape, f"output {o.name!r}")
                if t.metric == "unchanged":
                    raise ValueError(f"output {o.name!r}: metric 'unchanged' applies to state_checks only")
        mutable = {a.name: a for a in self.args if isinstance(a, TensorArg) and a.mutable}
        for name, checks in self.state_checks.items():
            if name not in mutable:
                raise ValueError(f"state_checks names {name!r}, which is not a mutable tensor argument")
            for t in checks:
                self._check_axes(t, mutable[name].shape, f"state of {name!r}")
        missing = set(mutable) - set(self.state_checks)
        if missing:
            raise ValueError(f"mutable arguments without state_checks: {sorted(missing)}")
        if not self.outputs and not mutable:
            raise ValueError("a task needs outputs, or mutable arguments (an in-place operator)")
        tensors: list[TensorArg | OutputSpec] = [a for a in self.args if isinstance(a, TensorArg)]
        for tensor in tensors + list(self.outputs):
            for w in self.all_workloads() if tensor.dtype_param else []:
                value = w.params.get(tensor.dtype_param) if tensor.dtype_param else None
                if tensor.dtype_param in w.params and not (isinstance(value, str) and value in DTYPES):
                    raise ValueError(f"workload {w.id!r} sets {tensor.dtype_param}={value!r} "
                                     f"(dtype of {tensor.name!r}), not one of {DTYPES}")
        ids = [w.id for w in self.all_workloads()]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"duplicate workload ids: {sorted(dup)}")
        checked = {o.name: o.shape for o in self.outputs} | {n: a.shape for n, a in mutable.items()}
        for w in self.all_workloads():
            for name, checks in w.checks.items():
                if name not in checked:
                    raise ValueError(f"workload {w.id!r} overrides checks of unknown output {name!r}")
                if name not in mutable and any(t.metric == "unchanged" for t in checks):
                    raise ValueError(f"workload {w.id!r} output {name!r}: metric 'unchanged' applies to state_checks only")
                for t in checks:
                    self._check_axes(t, checked[name], f"workload {w.id!r} output {name!r}")
            if set(w.axes) != axes:
                raise ValueError(
                    f"workload {w.id!r} gives axes {sorted(w.axes)}, the arguments use {sorted(axes)}"
                )
            shapes = {o.name: o.shape for o in self.outputs}
            for name, strides in w.strides.items():
                if name not in shapes:
                    raise ValueError(f"workload {w.id!r} overrides strides of unknown output {name!r}")
                _check_dims(strides, axes, f"workload {w.id!r} strides of {name!r}", len(shapes[name]))
        self._check_alternatives()
        self._check_workload_sizes()
        for name in ("reference", *self.sol.variants):
            c = self.sol.counts(name)
            for field in ("tc_flops", "fp32_flops", "bytes"):
                unknown = formula_names(getattr(c, field)) - axes
                if unknown:
                    raise ValueError(f"sol {name}.{field} uses unknown names {sorted(unknown)}")
        return self

    def _check_workload_sizes(self) -> None:
        """Every workload's axis values are sizes (>= 1, or >= 0 for ``empty_axes``), and every
        shape and stride of the arguments and outputs evaluates to a whole number >= 0 on it.

        Raises:
            ValueError: naming the task, the workload and the axis, argument or output.
        """
        axes = self.axis_names()
        unknown = sorted(set(self.empty_axes) - axes)
        if unknown:
            raise ValueError(f"task {self.id!r}: empty_axes names {unknown}, not axes of the arguments")
        for w in self.all_workloads():
            where = f"task {self.id!r}: workload {w.id!r}"
            for ax, v in w.axes.items():
                if v < 0:
                    raise ValueError(f"{where}: axis {ax!r} = {v}: a size cannot be negative")
                if v == 0 and ax not in self.empty_axes:
                    raise ValueError(f"{where}: axis {ax!r} = 0: a size must be >= 1 "
                                     f"(list {ax!r} in empty_axes if a workload may have none)")
            dims = [(f"argument {a.name!r} shape", a.shape) for a in self.tensor_args()]
            for o in self.outputs:
                dims.append((f"output {o.name!r} shape", o.shape))
                dims.append((f"output {o.name!r} strides", self.strides_for(o, w) or []))
            for what, entries in dims:
                for d in entries:
                    if isinstance(d, int):
                        continue
                    try:
                        value = evaluate_formula(d, w.axes) if not is_axis_name(d) else w.axes[d]
                    except (FormulaError, ArithmeticError) as e:
                        raise ValueError(f"{where}: {what} entry {d!r} cannot be evaluated: {e}") from None
                    if value < 0 or value != int(value):
                        raise ValueError(f"{where}: {what} entry {d!r} = {value}, not a whole number >= 0")

    def _check_alternatives(self) -> None:
        """Alternative names and files are unique; at most one ``compile_reference`` (default mode:
        a second one would be the same comparator)."""
        for what, values in (("names", [a.name for a in self.alternatives]),
                             ("files", [a.file for a in self.alternatives if a.file])):
            dup = {v for v in values if values.count(v) > 1}
            if dup:
                raise ValueError(f"duplicate alternative {what}: {sorted(dup)}")
        if sum(a.compile_reference for a in self.alternatives) > 1:
            raise ValueError("at most one alternative may set compile_reference (torch.compile, default mode)")

    @staticmethod
    def _check_axes(t: Tolerance, shape: list, where: str) -> None:
        for ax in t.slice_dims + ([t.sample.axis] if t.sample else []):
            if ax not in shape:
                raise ValueError(f"{where}: tolerance axis {ax!r} is not in its shape {shape}")

    def returned_container(self) -> str:
        """How ``run`` returns its outputs, by the number declared in ``outputs``: ``"none"`` (an
        in-place operator: ``None``, or an empty tuple), ``"bare"`` (one output: the tensor
        itself), ``"tuple"`` (several: a ``tuple`` in the declared order, not a list)."""
        return "none" if not self.outputs else "bare" if len(self.outputs) == 1 else "tuple"

    def container_problem(self, container: str | None) -> str | None:
        """Why a ``run`` result whose type is named ``container`` (``type(result).__name__``, as
        the worker reports it) breaks :meth:`returned_container`; None when it does not.

        Only the container is judged here: the number of outputs and their types are checked
        separately (a bare non-tensor is a structure failure, not a container one)."""
        kind = self.returned_container()
        if kind == "none" and container not in ("NoneType", "tuple"):
            return f"returned a {container}; an in-place operator returns None (or an empty tuple)"
        if kind == "bare" and container in ("tuple", "list"):
            return (f"returned a {container}; the task's one output ({self.outputs[0].name}) is returned "
                    "bare, as the tensor itself")
        if kind == "tuple" and container != "tuple":
            names = ", ".join(o.name for o in self.outputs)
            return f"returned a {container}; the {len(self.outputs)} outputs ({names}) are returned as a tuple"
        return None

    def all_workloads(self) -> list[Workload]:
        return [*self.workloads, *self.smoke_workloads]

    def axis_names(self) -> set[str]:
        """Every axis a workload must give: axis names in tensor-argument shapes, plus the axes
        that int scalar arguments are bound to (``ScalarArg.axis``)."""
        axes = {str(ax) for a in self.tensor_args() for ax in a.shape if is_axis_name(ax)}
        axes |= {a.count for a in self.tensor_args() if a.count}
        return axes | {a.axis for a in self.args if isinstance(a, ScalarArg) and a.axis}

    def timing_for(self, workload: Workload) -> Timing:
        """The timing of ``workload``: its own override, else the task's."""
        return workload.timing or self.timing

    def strides_for(self, output: OutputSpec, workload: Workload) -> list[str | int] | None:
        """The required strides of ``output`` on ``workload`` (None: any layout)."""
        return workload.strides.get(output.name, output.strides)

    def workload(self, wid: str) -> Workload:
        for w in self.all_workloads():
            if w.id == wid:
                return w
        known = ", ".join(w.id for w in self.all_workloads())
        raise KeyError(f"task {self.id!r} has no workload {wid!r} (known: {known})")

    def tensor_args(self) -> list[TensorArg]:
        return [a for a in self.args if isinstance(a, TensorArg)]

    def alternative(self, name: str) -> Alternative:
        """The declared alternative ``name``.

        Raises:
            KeyError: no such alternative (the message lists the known ones).
        """
        for a in self.alternatives:
            if a.name == name:
                return a
        known = ", ".join(a.name for a in self.alternatives) or "none"
        raise KeyError(f"task {self.id!r} has no alternative {name!r} (known: {known})")


class GuidanceItem(_Strict):
    """One piece of expert design guidance (rationale only: no code, no tuning constants)."""

    id: str
    level: Level
    title: str
    text: str
    depends_on: list[str] = []


class Guidance(_Strict):
    """``guidance.yaml``: L1/L2/L3 items with dependencies."""

    task: str
    items: list[GuidanceItem] = Field(min_length=3)

    @model_validator(mode="after")
    def _resolve(self) -> Guidance:
        ids = [i.id for i in self.items]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"duplicate guidance ids: {sorted(dup)}")
        order = {lvl: n for n, lvl in enumerate(LEVELS)}
        by_id = {i.id: i for i in self.items}
        for item in self.items:
            for dep in item.depends_on:
                if dep not in by_id:
                    raise ValueError(f"guidance item {item.id!r} depends on unknown id {dep!r}")
                if order[by_id[dep].level] > order[item.level]:
                    raise ValueError(
                        f"guidance item {item.id!r} ({item.level}) depends on {dep!r} of a later level"
                    )
        levels = {i.level for i in self.items}
        if levels != set(LEVELS):
            raise ValueError(f"guidance must cover L1, L2 and L3 (has {sorted(levels)})")
        return self

    def up_to(self, level: str) -> list[GuidanceItem]:
        """Cumulative guidance: every item of ``level`` and the levels before it."""
        if level == "none":
            return []
        if level not in LEVELS:
            raise ValueError(f"unknown guidance level {level!r}")
        keep = LEVELS[: LEVELS.index(level) + 1]
        return [i for i in self.items if i.level in keep]


class RubricProperty(_Strict):
    """A property an implementation or design must show to earn credit at one level."""

    id: str
    description: str
    removes: str
    guidance: list[str] = []
    partial: str = ""
    expert: str = ""  # where and how solutions/expert.py realises it (the rubric's fit to the expert)


class RubricLevel(_Strict):
    properties: list[RubricProperty] = Field(min_length=1)
    accepted_alternatives: list[str] = []
    judge_notes: str = ""


class Rubric(_Strict):
    """``rubric.yaml``: judge criteria per level (held back from agents)."""

    task: str
    version: str
    L1: RubricLevel
    L2: RubricLevel
    L3: RubricLevel
