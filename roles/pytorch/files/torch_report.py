# Run with the virtualenv's interpreter after installation: what torch reports about itself.
# The numpy round trip catches a torch 1.x + numpy 2.x pair ("Numpy is not available").
import json

import torch

report = {
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "cuda_available": torch.cuda.is_available(),
    "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    "numpy_bridge": None,
}
try:
    import numpy

    report["numpy"] = numpy.__version__
    report["numpy_bridge"] = torch.from_numpy(numpy.ones(2)).sum().item() == 2.0
except Exception as exc:  # report it; the role's assert says what to change
    report["numpy_bridge"] = False
    report["numpy_error"] = str(exc)
print(json.dumps(report))
