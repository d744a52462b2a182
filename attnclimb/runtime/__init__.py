"""Kernel toolchain: NVRTC compile + disk cache, module load and launch, TMA tensor maps."""

from .compiler import CompiledRung, CompileError, Resources, cache_dir, compile_rung, parse_ptxas_log

__all__ = ["CompileError", "CompiledRung", "Resources", "cache_dir", "compile_rung", "parse_ptxas_log"]
