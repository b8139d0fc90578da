"""Video trackers whose forward takes an inference session (issue 12): SAM2-Video, EdgeTAM-Video
and SAM3-Tracker-Video are analyzed on the first frame of a session built from tensors, one
clicked point per object; SAM3-Video on the first frame of a text-prompted session, where its
detector finds --batch objects (`exportflops.hf.session`).

Sizes from transformers 5.23's default configs: Sam2VisionConfig's image_size is 1024 (SAM 2's
published 1024 x 1024 input), Sam3's 1008 (72 patches of 14); SAM 3's text encoder has 32
positions, the length its processor pads a prompt to.
"""

from __future__ import annotations

import pytest
import torch

from exportflops import analyze
from exportflops.hf.models import hf_model
from exportflops.hf.session import DetectedFrame, detect_objects, tracked_frame
from exportflops.errors import ExportError, UsageError
from exportflops.capture.hints import meta_only

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


@pytest.fixture(scope="module")
def detected_frame():
    """SAM3-Video, one layer a stack, on cpu: the scores its thresholds are set by need the
    weights' values, drawn from a fixed seed (unseeded, two objects' scores came out too close
    to set a threshold between now and then)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return hf_model("sam3_video", torch.device("cpu"), None, layers=1, batch=1)


def test_a_text_prompted_tracker_is_analyzed_on_a_frame_where_it_finds_batch_objects(
        detected_frame):
    frame, args, kwargs = detected_frame
    pixels, ids, mask = args
    assert pixels.shape == (1, 3, 1008, 1008) and ids.shape == mask.shape == (1, 32)
    one = analyze(frame, args, kwargs)
    detect_objects(frame.model, *args, 2)
    two = analyze(DetectedFrame(frame.model, frame.session_class, 2), args, kwargs)
    assert not one.uncounted and not two.uncounted
    one, two = _rows(one), _rows(two)
    # The frame is encoded once, whatever the detector finds.
    assert one["model.detector_model.vision_encoder"] == two[
        "model.detector_model.vision_encoder"] > 0
    # Each object found starts a track: the tracker runs its mask decoder's two-way transformer
    # and its memory encoder on a batch of one row per object, so two objects cost twice one,
    # but for the memory's sine position encoding's frequencies, computed once a call:
    # temperature ** (2 * (i // 2) / 32) for 32 features, 4 ops on 32 values = 128 FLOPs.
    transformer = "model.tracker_model.mask_decoder.transformer"
    assert two[transformer] == 2 * one[transformer] > 0
    memory = "model.tracker_model.memory_encoder"
    assert two[memory] - 128 == 2 * (one[memory] - 128) > 0
    # The first frame has no earlier frame in memory to attend to.
    assert one["model.tracker_model.memory_attention"] == 0


def test_more_objects_than_the_detector_proposes_is_refused_naming_the_most(detected_frame):
    # Sam3 DETR's decoder proposes num_queries = 200 objects a frame.
    frame, args, _ = detected_frame
    with pytest.raises(UsageError, match=r"proposes 200 objects a frame; pass batch= from 1 "
                                         r"to 199"):
        detect_objects(frame.model, *args, 200)


def test_a_text_prompted_tracker_on_meta_names_cpu_where_the_command_builds_it_again():
    frame, args, kwargs = hf_model("sam3_video", META, None, layers=1)
    with pytest.raises(ExportError, match=r'data-dependent.*device="cpu"') as error:
        analyze(frame, args, kwargs)
    # What the command reads to build an hf: model again on cpu (`analyze_deciding_on_cpu`).
    assert meta_only(error.value.__cause__) == "it branches on its inputs' values"


class Session:
    """A session of a kind hf: does not build: neither clicked points nor a text prompt."""


class BySession(torch.nn.Module):
    def forward(self, inference_session: Session, frame_idx: int = 0) -> torch.Tensor:
        return torch.zeros(1)


def test_a_session_prompted_otherwise_is_refused_naming_it():
    config = tf.PretrainedConfig()
    with pytest.raises(UsageError, match=r"'inference_session', a Session, not a tensor.*"
                                         r"or build the session and call analyze\(\)"):
        tracked_frame(BySession(), Session, config, META, batch=1, seq=None)


def test_a_video_sub_model_reads_its_inputs_from_the_tracker():
    # The mask decoder of SAM2-Video: its image embeddings are the tracker's, 1024 / 16 = 64
    # a side at the decoder's hidden size 256.
    model, args, kwargs = hf_model("sam2_video_mask_decoder", META, None, layers=1)
    shapes = [tuple(a.shape) for a in args] + [tuple(v.shape) for v in kwargs.values()
                                               if isinstance(v, torch.Tensor)]
    assert (1, 256, 64, 64) in shapes
    assert not analyze(model, args, kwargs).uncounted
