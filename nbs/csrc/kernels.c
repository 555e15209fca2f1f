/* The C kernels, compiled as one unit (the build compiles this file only): the shared helpers first, the masking of keys, then one file
   per normalizer with its forward and backward side by side, the fused attention that calls them, the block's
   elementwise layers, and the random numbers for dropout. Row kernels run one row at a time in L1 (long rows); lane kernels 16 rows at once (short rows). */
#include "kernels.h"
#include "fastmath.h"
#include "lanes.h"
#include "mask.c"
#include "sparsemax.c"
#include "entmax.c"
#include "topk.c"
#include "softmax.c"
#include "attention.c"
#include "block.c"
#include "random.c"
