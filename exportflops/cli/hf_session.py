"""A video tracker whose forward takes an inference session, not tensors: SAM2-Video's
``forward(inference_session, frame_idx)`` reads the frames and the clicked points from a session
object that transformers' processor fills. `TrackedFrame` builds that session inside its own
forward from tensors (the frame, and one clicked point per tracked object) with the session
class's own constructor and methods, so torch.export traces the frame's whole computation: the
image encoder, the prompt encoder and mask decoder for each object, and the memory encoder that
stores the frame for the next. Nothing in transformers is patched. Module paths carry the
wrapper's ``model.`` prefix.

The frame analyzed is the first, where the objects are clicked: it has no earlier frame in
memory, so memory attention costs nothing in it. A session holding earlier frames does not
export on meta (transformers makes the memories' temporal offsets with ``torch.tensor``,
which torch.export's fake tensors refuse there)."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..errors import UsageError
from .hf_media import image_size, sub_config

#: The points clicked on each object in the frame: one, a positive click (label 1), as a
#: user's first click on an object is.
POINTS_PER_OBJECT = 1
POSITIVE_CLICK = 1


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
        device, (height, width) = pixel_values.device, pixel_values.shape[-2:]
        session = self.session_class(
            video=pixel_values, video_height=height, video_width=width,
            inference_device=device, inference_state_device=device,
            video_storage_device=device, dtype=pixel_values.dtype)
        objects = list(range(input_points.shape[1]))
        for obj_id in objects:
            # The processor's per-object slice: (1, 1, points, 2) and (1, 1, points).
            session.add_point_inputs(session.obj_id_to_idx(obj_id), 0, {
                "point_coords": input_points[:, obj_id:obj_id + 1],
                "point_labels": input_labels[:, obj_id:obj_id + 1]})
        session.obj_with_new_inputs = objects
        return self.model(session, frame_idx=0, **kwargs).pred_masks


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


def tracked_frame(model, session: type, config, device, *, batch: int
                  ) -> tuple[TrackedFrame, tuple, dict[str, Any]]:
    """``model`` wrapped in a `TrackedFrame` and its example inputs: a frame of the vision
    config's image size and ``batch`` objects, each clicked once. A session that takes no
    clicked points (SAM3-Video's, prompted by text) is refused with a UsageError."""
    parameter = next(iter(inspect.signature(model.forward).parameters))
    if not all(callable(getattr(session, name, None))
               for name in ("obj_id_to_idx", "add_point_inputs")):
        # SAM3-Video's: a detector's objects, kept in Python dicts of scores, then tracked.
        parts = [f"hf:{sub.model_type}" for sub in vars(config).values()
                 if hasattr(sub, "to_dict") and getattr(sub, "model_type", "")]
        raise UsageError(f"{type(model).__name__}.forward takes {parameter!r}, a "
                         f"{session.__name__}, not a tensor, and exportflops makes that object "
                         f"only for trackers prompted by clicked points (SAM2-Video); analyze "
                         f"its parts on their own ({', '.join(parts) or 'its tensor modules'}), "
                         f"or build the session and call analyze() from Python.")
    vision = sub_config(config, "vision")
    height, width = image_size(vision)
    frame = torch.zeros((1, getattr(vision, "num_channels", 3), height, width), device=device)
    points = torch.zeros((1, batch, POINTS_PER_OBJECT, 2), device=device)
    labels = torch.full((1, batch, POINTS_PER_OBJECT), POSITIVE_CLICK, dtype=torch.int32,
                        device=device)
    return TrackedFrame(model, session), (frame, points, labels), {}
