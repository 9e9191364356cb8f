"""The element types Kineto writes in ``Input type``: their size in bytes, the compute dtype
each one picks a peak by, and the ``ScalarType`` codes a ``dtype=`` argument is recorded as.
Facts, not formulas: every family module reads its operands' sizes here."""

from __future__ import annotations

#: Element size in bytes for the tensor type names Kineto writes in ``Input type``: c10
#: ``TypeMeta`` names, i.e. the compiler's demangled C++ type (GCC ``long int``, checked against
#: torch 2.13 on CPU; clang ``long``, as in the 2022 torchrec fixture).
ELEMENT_SIZE: dict[str, int] = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "short unsigned int": 2,
    "unsigned int": 4,
    "long unsigned int": 8,
    "long": 8,  # clang spellings of the integer types
    "long long": 8,
    "short": 2,
    "unsigned short": 2,
    "unsigned long": 8,
    "unsigned long long": 8,
    "c10::complex<c10::Half>": 4,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1,
    "c10::Float4_e2m1fn_x2": 1,
    "c10::qint8": 1,
    "c10::quint8": 1,
    "c10::qint32": 4,
}

#: Kineto type name -> compute dtype used to pick a peak (peaks.py: fp64, fp32, fp16, bf16,
#: fp8, int8; other names have no peak).
COMPUTE_DTYPE: dict[str, str] = {
    "float": "fp32",
    "double": "fp64",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
    "c10::Float8_e8m0fnu": "fp8",
    "c10::Float4_e2m1fn_x2": "fp4",
    "signed char": "int8",
    "c10::qint8": "int8",
    "unsigned char": "uint8",
    "c10::quint8": "uint8",
    "short int": "int16",
    "int": "int32",
    "c10::qint32": "int32",
    "long int": "int64",
    "short unsigned int": "uint16",
    "unsigned int": "uint32",
    "long unsigned int": "uint64",
    "long": "int64",
    "long long": "int64",
    "short": "int16",
    "unsigned short": "uint16",
    "unsigned long": "uint64",
    "unsigned long long": "uint64",
    "bool": "bool",
    "c10::complex<c10::Half>": "complex32",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
}

#: c10::ScalarType codes as Kineto records a ``ScalarType`` argument (``aten::_to_copy`` dtype
#: ``'5'`` = Half, ``'6'`` = Float, ``'15'`` = BFloat16: c10/core/ScalarType.h enum order).
SCALAR_TYPE_CODES: dict[int, str] = {
    0: "unsigned char",
    1: "signed char",
    2: "short int",
    3: "int",
    4: "long int",
    5: "c10::Half",
    6: "float",
    7: "double",
    8: "c10::complex<c10::Half>",
    9: "c10::complex<float>",
    10: "c10::complex<double>",
    11: "bool",
    15: "c10::BFloat16",
    23: "c10::Float8_e5m2",
    24: "c10::Float8_e4m3fn",
    25: "c10::Float8_e5m2fnuz",
    26: "c10::Float8_e4m3fnuz",
}
