"""What `export` hands back: `ExportReport` on success, `ExportError` when verification fails."""

from __future__ import annotations

import dataclasses

from tapeworks.errors import TapeworksError


class ExportError(TapeworksError, RuntimeError):
    """An artefact failed its verification; nothing was left at the path."""


@dataclasses.dataclass
class ExportReport:
    """What `export` wrote and measured, in the process that verified it.

    `agreement` is the share of examples whose largest class score (argmax)
    is the same in the artefact as in the model, for outputs that are class
    scores (on the validation inputs when given, else on the verification
    batch). `kept_float` names the layers a quantised LiteRT model keeps in
    float32 because int8 lost too much in them (`LayerError`s, worst first),
    empty when every layer is quantised.
    """

    path: str
    format: str
    size_bytes: int
    load_seconds: float        # loading the artefact in the verifying process
    single_seconds: float      # median latency of one example
    batch_seconds: float       # median latency of the verification batch
    batch_size: int
    max_difference: dict       # output name -> largest absolute difference from the model
    verified_in: str           # "a fresh process", or why it was this one
    inputs: list               # the signature's input names
    outputs: list              # its output names
    quantize: str | None = None     # tflite: None (float32), "dynamic", "float16" or "int8"
    metric: dict | None = None      # validation_data: {"name", "model", "artefact", "tolerance"}
    signatures: list | None = None  # saved_model: "serving_default" and the extra ones
    agreement: float | None = None  # argmax agreement with the model, for class scores
    kept_float: list = dataclasses.field(default_factory=list)   # LayerErrors kept in float
    advice: str = ""           # where preprocessing is what int8 cannot hold: the other option

    def __str__(self):
        worst = max(self.max_difference.values()) if self.max_difference else 0.0
        kind = self.format + (f" ({self.quantize})" if self.quantize else "")
        metric = (f"; {self.metric['name']} {self.metric['model']:.4g} (model) -> "
                  f"{self.metric['artefact']:.4g} (artefact) on the validation data"
                  if self.metric else "")
        if self.metric and self.quantize:   # what the quantised model was judged by
            metric += f" (tolerance: {self.metric['tolerance']})"
        agreement = (f"; argmax agreement with the model {self.agreement:.1%}"
                     if self.agreement is not None else "")
        kept = ("; kept in float32: " + "; ".join(str(layer) for layer in self.kept_float)
                if self.kept_float else "")
        return (f"{kind} artefact at {self.path}: {self.size_bytes / 1024:,.1f} KiB, "
                f"inputs {', '.join(self.inputs)} -> outputs {', '.join(self.outputs)}; "
                f"verified in {self.verified_in}: largest difference {worst:.2e} from the "
                f"model; load {self.load_seconds:.2f} s, latency "
                f"{self.single_seconds * 1e3:.3f} ms for one example, "
                f"{self.batch_seconds * 1e3:.3f} ms for {self.batch_size}{metric}{agreement}"
                f"{kept}" + (f"\n{self.advice}" if self.advice else ""))
