"""Roofline: each node's time predicted from its FLOPs and bytes on a device.

``devices`` is the sourced, dated table of dense peak FLOP/s and memory bandwidth per device;
``predict`` places each node of a report under that device's roofs.
"""

from .predict import roofline

__all__ = ["roofline"]
