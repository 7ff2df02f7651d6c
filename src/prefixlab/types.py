"""Type aliases the whole package shares: numpy arrays by element type, and table rows.

The compiled kernels' state is numpy arrays; their annotations say the element type
(numba reads none of them). A row is one record of a results or summary table, as pyarrow
and JSON give it: column name to a plain value.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: arrays by element type
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]
U8 = npt.NDArray[np.uint8]
U64 = npt.NDArray[np.uint64]
F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]
B1 = npt.NDArray[np.bool_]

#: a plain value of a table cell or a JSON document
Scalar = str | int | float | bool | None
#: a JSON value (a config resolved, a cell file, a report's data)
JSON = Scalar | list["JSON"] | dict[str, "JSON"]
#: one record of a table: column name to value
Row = dict[str, object]
