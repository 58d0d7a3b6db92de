"""torch eager's own post-processed detections, padded as a bundle returns them: the reference of the detection
tests (tests/test_detection.py, tests/board/test_detection_boards.py)."""
from typing import Any, Dict

import numpy as np
import torch


def padded_detections(rows: Any, size: int = 6) -> Dict[str, np.ndarray]:
    """A padded detection result from (label, score, x1, y1, x2, y2) rows."""
    rows = np.asarray(rows, np.float64).reshape(-1, 6)
    pad = size - len(rows)
    return {"boxes": np.pad(rows[:, 2:].astype(np.float32), ((0, pad), (0, 0))),
            "scores": np.pad(rows[:, 1].astype(np.float32), (0, pad)),
            "labels": np.pad(rows[:, 0].astype(np.int64), (0, pad)), "count": np.asarray(len(rows))}


def ultralytics_result(model: Any, image: torch.Tensor, conf: float = 0.25, iou: float = 0.45,
                       max_det: int = 300) -> Dict[str, np.ndarray]:
    """ultralytics' own post-processing of the eager model's output, padded as the bundle returns it."""
    from ultralytics.utils.nms import non_max_suppression

    with torch.no_grad():
        rows = non_max_suppression(model(image)[0], conf, iou, max_det=max_det)[0].numpy()
    padded = padded_detections(np.concatenate([rows[:, 5:6], rows[:, 4:5], rows[:, :4]], 1), max_det)
    return {key: value[None] for key, value in padded.items()}


def torchvision_result(model: Any, image: torch.Tensor) -> Dict[str, np.ndarray]:
    """torchvision's own post-processed output (outside any capture), padded to detections_per_img rows."""
    with torch.no_grad():
        result = model(image)[0]
    rows = np.concatenate([result["labels"][:, None].numpy(), result["scores"][:, None].numpy(),
                           result["boxes"].numpy()], 1)
    return padded_detections(rows, model.detections_per_img)
