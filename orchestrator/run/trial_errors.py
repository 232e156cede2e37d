"""Which errors of a trial are out-of-memory errors, and which break the CUDA context."""

from __future__ import annotations


def oom_errors() -> tuple[type[BaseException], ...]:
    import torch

    errors: list[type[BaseException]] = [torch.cuda.OutOfMemoryError]
    generic = getattr(torch, "OutOfMemoryError", None)
    if generic is not None and generic not in errors:
        errors.append(generic)
    return tuple(errors)


# When the GPU is truly full, cuBLAS, cuDNN or the context itself can fail with a RuntimeError
# instead of torch's OutOfMemoryError: the same event, and it gets the same treatment.
CUDA_OOM_MARKS = (
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)


def is_cuda_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and any(mark in str(error) for mark in CUDA_OOM_MARKS)


CUDA_ERROR_MARKS = ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS", "cuDNN error", "NCCL error")


def is_cuda_error(error: BaseException) -> bool:
    """A CUDA failure other than out-of-memory: after one, the process's context is suspect."""
    import torch

    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return True
    return isinstance(error, RuntimeError) and any(mark in str(error) for mark in CUDA_ERROR_MARKS)
