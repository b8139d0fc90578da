"""A video tracker whose forward takes an inference session, not tensors: SAM2-Video's
``forward(inference_session, frame_idx)`` reads the frames and the clicked points from a session
object that transformers' processor fills. A wrapper builds that session inside its own forward
from tensors, with the session class's own constructor and methods, so torch.export traces the
frame's whole computation. Nothing in transformers is patched. Module paths carry the wrapper's
``model.`` prefix.

- `TrackedFrame` (SAM2-Video, EdgeTAM-Video, SAM3-Tracker-Video): one clicked point per tracked
  object; the image encoder, the prompt encoder and mask decoder for each object, and the
  memory encoder that stores the frame for the next.
- `DetectedFrame` (SAM3-Video): a text prompt; the image and text encoders, the detector, and
  the tracker started on each object the detector finds. How many it finds is a value of the
  frame, not a size: the model's detection thresholds are set between the example's scores so
  that it finds ``batch`` objects (`detect_objects`), and torch.export decides each of the
  model's branches on them as the example does (`capture`).

The frame analyzed is the first: it has no earlier frame in memory, so memory attention costs
nothing in it. A session holding earlier frames does not export on meta (transformers makes
the memories' temporal offsets with ``torch.tensor``, which torch.export's fake tensors refuse
there)."""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from ..errors import UsageError
from .modalities import text_length
from .media import image_size, sub_config

#: The points clicked on each object in the frame: one, a positive click (label 1), as a
#: user's first click on an object is.
POINTS_PER_OBJECT = 1
POSITIVE_CLICK = 1
#: The text a detecting session is prompted with: it only names the prompt (its tokens are the
#: example's ``input_ids``).
PROMPT = "object"
#: The model's attributes holding the score over which the detector keeps an object and over
#: which a kept object starts a new track (SAM3-Video's ``score_threshold_detection`` and
#: ``new_det_thresh``); `detect_objects` sets both.
THRESHOLDS = ("score_threshold_detection", "new_det_thresh")
#: The least relative gap between the scores a threshold is set between: float32 kernels may
#: order their sums otherwise from one run to the next, moving a score by a few ulps.
SCORE_TOLERANCE = 1e-4


def _session(session_class: type, pixel_values: torch.Tensor):
    """A session of the one frame ``pixel_values`` ``(1, channels, height, width)``, kept on
    its device."""
    device, (height, width) = pixel_values.device, pixel_values.shape[-2:]
    return session_class(video=pixel_values, video_height=height, video_width=width,
                         inference_device=device, inference_state_device=device,
                         video_storage_device=device, dtype=pixel_values.dtype)


class TrackedFrame(torch.nn.Module):
    """The first frame of a tracking session of ``model`` (its forward takes a
    ``session_class``), with one clicked point per object; returns the objects' masks."""

    def __init__(self, model: torch.nn.Module, session_class: type) -> None:
        super().__init__()
        self.model = model
        self.session_class = session_class

    def forward(self, pixel_values: torch.Tensor, input_points: torch.Tensor,
                input_labels: torch.Tensor, **kwargs) -> torch.Tensor:
        """``pixel_values`` ``(1, channels, height, width)``: the frame; ``input_points``
        ``(1, objects, points, 2)`` and ``input_labels`` ``(1, objects, points)``: the clicks
        on each object, as transformers' video processor lays them out. ``kwargs`` go to the
        model's forward (``run_mem_encoder=False`` leaves the memory encoder out)."""
        session = _session(self.session_class, pixel_values)
        objects = list(range(input_points.shape[1]))
        for obj_id in objects:
            # The processor's per-object slice: (1, 1, points, 2) and (1, 1, points).
            session.add_point_inputs(session.obj_id_to_idx(obj_id), 0, {
                "point_coords": input_points[:, obj_id:obj_id + 1],
                "point_labels": input_labels[:, obj_id:obj_id + 1]})
        session.obj_with_new_inputs = objects
        return self.model(session, frame_idx=0, **kwargs).pred_masks


class DetectedFrame(torch.nn.Module):
    """The first frame of a text-prompted session of ``model`` (its forward takes a
    ``session_class``, SAM3-Video's): the detector finds the objects the prompt names, and the
    tracker starts on each; returns the objects' masks."""

    def __init__(self, model: torch.nn.Module, session_class: type, objects: int | None
                 ) -> None:
        """``objects``: how many objects `detect_objects` set ``model``'s thresholds to find;
        None where it could not (a model on meta holds no scores)."""
        super().__init__()
        self.model = model
        self.session_class = session_class
        self.objects = objects

    def forward(self, pixel_values: torch.Tensor, input_ids: torch.Tensor,
                attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        """``pixel_values`` ``(1, channels, height, width)``: the frame; ``input_ids`` and
        ``attention_mask`` ``(1, tokens)``: the prompt, as transformers' processor adds it to
        a session. ``kwargs`` go to the model's forward. Returns ``(objects, 1, height,
        width)``: the low-resolution mask of each object found."""
        if self.objects is None:
            raise UsageError(f"How many objects {type(self.model).__name__}'s detector finds "
                             f"on a frame is data-dependent (its scores' values), and a model "
                             f"on meta holds none: build it on cpu (device=\"cpu\", with "
                             f"layers=N to keep it small).")
        session = _session(self.session_class, pixel_values)
        prompt = session.add_prompt(PROMPT)
        session.prompt_input_ids[prompt] = input_ids
        session.prompt_attention_masks[prompt] = attention_mask
        out = self.model(session, frame_idx=0, **kwargs)
        return torch.cat([out.obj_id_to_mask[obj_id] for obj_id in out.object_ids])


def detect_objects(model, pixel_values: torch.Tensor, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, objects: int) -> None:
    """Set ``model``'s `THRESHOLDS` midway between the ``objects``-th and the next highest
    score its detector gives the example (the product of each query's probability and the
    prompt's presence probability, as ``Sam3VideoModel.run_detection`` scores them), so that
    on this frame it finds and starts tracking ``objects`` objects. The weights are a config's
    (no download), so the count the thresholds of a trained model would give means nothing
    here; a count of objects does."""
    detector = model.detector_model
    with torch.no_grad():
        vision = detector.get_vision_features(pixel_values=pixel_values)
        text = detector.get_text_features(input_ids=input_ids, attention_mask=attention_mask,
                                          return_dict=True)
        out = detector(vision_embeds=vision, text_embeds=text, attention_mask=attention_mask)
    scores = (out.pred_logits.sigmoid() * out.presence_logits.sigmoid()).flatten()
    ranked = scores.sort(descending=True).values.tolist()
    if not 1 <= objects < len(ranked):
        raise UsageError(f"batch={objects}: {type(model).__name__}'s detector proposes "
                         f"{len(ranked)} objects a frame; pass batch= from 1 to "
                         f"{len(ranked) - 1}.")
    found, missed = ranked[objects - 1], ranked[objects]
    # Scores this close could swap in the export's own run of the detector.
    if math.isclose(found, missed, rel_tol=SCORE_TOLERANCE):
        raise UsageError(f"batch={objects}: {type(model).__name__}'s detector scores object "
                         f"{objects} and object {objects + 1} alike on the example frame "
                         f"({found:.7g} and {missed:.7g}), so no threshold finds exactly "
                         f"{objects}; pass another batch=.")
    for name in THRESHOLDS:
        setattr(model, name, (found + missed) / 2)


def session_class(model) -> type | None:
    """The class of the object ``model.forward`` takes first where it is one of transformers'
    own classes (SAM2-Video's ``Sam2VideoInferenceSession``), not a tensor; else None."""
    parameters = list(inspect.signature(model.forward).parameters.values())
    kind = parameters[0].annotation if parameters else None
    # A class of transformers' own; not a tensor type (torch.LongTensor is no subclass of
    # torch.Tensor), a builtin, or no annotation (inspect's empty marker is a class too).
    if (isinstance(kind, type) and kind is not inspect.Parameter.empty
            and not issubclass(kind, torch.Tensor)
            and kind.__module__.split(".")[0] not in ("builtins", "torch", "typing")):
        return kind
    return None


def tracked_frame(model, session: type, config, device, *, batch: int, seq: int | None
                  ) -> tuple[torch.nn.Module, tuple, dict[str, Any]]:
    """``model`` wrapped in a `TrackedFrame` (a session of clicked points) or a `DetectedFrame`
    (a text-prompted one) and its example inputs: a frame of the vision config's image size
    and ``batch`` objects, each clicked once or found by the detector; ``seq`` prompt tokens.
    A session of another kind is refused with a UsageError."""
    if _has_methods(session, "obj_id_to_idx", "add_point_inputs"):
        vision = sub_config(config, "vision")
        frame = _frame(vision, device)
        points = torch.zeros((1, batch, POINTS_PER_OBJECT, 2), device=device)
        labels = torch.full((1, batch, POINTS_PER_OBJECT), POSITIVE_CLICK, dtype=torch.int32,
                            device=device)
        return TrackedFrame(model, session), (frame, points, labels), {}
    detector = getattr(config, "detector_config", None)
    if _has_methods(session, "add_prompt") and all(hasattr(model, n) for n in THRESHOLDS) \
            and detector is not None:
        frame = _frame(sub_config(detector, "vision"), device)
        text = detector.get_text_config()
        ids = torch.zeros((1, text_length(text, seq)), dtype=torch.long, device=device)
        mask = torch.ones_like(ids)
        objects = None
        if device.type != "meta":  # scores to set the thresholds by need the weights' values
            detect_objects(model, frame, ids, mask, batch)
            objects = batch
        return DetectedFrame(model, session, objects), (frame, ids, mask), {}
    parameter = next(iter(inspect.signature(model.forward).parameters))
    parts = [f"hf:{sub.model_type}" for sub in vars(config).values()
             if hasattr(sub, "to_dict") and getattr(sub, "model_type", "")]
    raise UsageError(f"{type(model).__name__}.forward takes {parameter!r}, a "
                     f"{session.__name__}, not a tensor, and exportflops makes that object "
                     f"only for trackers prompted by clicked points (SAM2-Video) or by text "
                     f"(SAM3-Video); analyze its parts on their own "
                     f"({', '.join(parts) or 'its tensor modules'}), or build the session and "
                     f"call analyze() from Python.")


def _has_methods(kind: type, *names: str) -> bool:
    return all(callable(getattr(kind, name, None)) for name in names)


def _frame(vision, device) -> torch.Tensor:
    """A zero frame ``(1, channels, height, width)`` of ``vision``'s image size."""
    height, width = image_size(vision)
    return torch.zeros((1, getattr(vision, "num_channels", 3), height, width), device=device)
