"""Video trackers whose forward takes an inference session (issue 12): SAM2-Video, EdgeTAM-Video
and SAM3-Tracker-Video are analyzed on the first frame of a session built from tensors, one
clicked point per object (`exportflops.cli.hf_session`).

Sizes from transformers 5.23's default configs: Sam2VisionConfig's image_size is 1024 (SAM 2's
published 1024 x 1024 input), Sam3's 1008 (72 patches of 14).
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze
from exportflops.cli.hf import hf_model
from exportflops.errors import UsageError

tf = pytest.importorskip("transformers")
META = torch.device("meta")


def _rows(report) -> dict[str, int]:
    return {m.path: m.inclusive.flops for m in report.modules}


@pytest.mark.parametrize("model_type, side", [("sam2_video", 1024), ("edgetam_video", 1024),
                                              ("sam3_tracker_video", 1008)])
def test_a_tracker_is_analyzed_on_a_frame_with_one_click_per_object(model_type, side):
    model, args, kwargs = hf_model(model_type, META, None, layers=1, batch=2)
    frame, points, labels = args
    assert frame.shape == (1, 3, side, side)
    # Two objects (--batch 2), one point each, laid out as the video processor lays them out.
    assert points.shape == (1, 2, 1, 2) and labels.shape == (1, 2, 1)
    assert labels.dtype == torch.int32
    report = analyze(model, args, kwargs)
    assert not report.uncounted and report.total.flops > 0


def test_the_frame_is_encoded_once_and_each_object_adds_one_decoder_pass():
    # Sam2VideoModel.forward encodes the frame once and runs the mask decoder and the memory
    # encoder once per object (batch_size=1 each); the decoder's projections of the frame's
    # high-resolution features (conv_s0, conv_s1) are computed once. So the image encoder does
    # not grow with the objects, and each further object adds the same amount to the rest.
    one, two, three = (_rows(analyze(*hf_model("sam2_video", META, None, layers=1, batch=n)))
                       for n in (1, 2, 3))
    assert one["model.vision_encoder"] == two["model.vision_encoder"] == three[
        "model.vision_encoder"] > 0
    for path in ("model.mask_decoder", "model.mask_decoder.transformer", "model.memory_encoder"):
        assert three[path] - two[path] == two[path] - one[path] > 0
    assert two["model.mask_decoder.conv_s0"] == one["model.mask_decoder.conv_s0"] > 0
    # The first frame has no earlier frame in memory to attend to.
    assert one["model.memory_attention"] == 0


def test_a_session_prompted_otherwise_is_refused_naming_it():
    # SAM3-Video's session is prompted by text and tracks detections, not clicked points;
    # its config holds its detector's (sam3) and its tracker's (sam3_tracker_video).
    with pytest.raises(UsageError, match=r"'inference_session', a Sam3VideoInferenceSession.*"
                                         r"\(hf:sam3, hf:sam3_tracker_video\)"):
        hf_model("sam3_video", META, None, layers=1)


def test_a_video_sub_model_reads_its_inputs_from_the_tracker():
    # The mask decoder of SAM2-Video: its image embeddings are the tracker's, 1024 / 16 = 64
    # a side at the decoder's hidden size 256.
    model, args, kwargs = hf_model("sam2_video_mask_decoder", META, None, layers=1)
    shapes = [tuple(a.shape) for a in args] + [tuple(v.shape) for v in kwargs.values()
                                               if isinstance(v, torch.Tensor)]
    assert (1, 256, 64, 64) in shapes
    assert not analyze(model, args, kwargs).uncounted
