"""Deprecated: the PyTorch CPU kernel moved to `keras_reluvit.kernels.torch_cpu`.

This name (shipped in 0.1.0) stays for one release: importing it warns and
gives that module itself (monkeypatching one patches the other).
"""

import sys
import warnings

from keras_reluvit.kernels import torch_cpu

warnings.warn("keras_reluvit.torch_fused is deprecated and will be removed after 0.2: use "
              "keras_reluvit.kernels.torch_cpu.", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = torch_cpu
