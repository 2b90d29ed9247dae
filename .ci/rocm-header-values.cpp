// Prints, as `NAME VALUE` lines, every HIP and hipBLASLt value that
// runtime/src/rocm/consts.rs copies from the headers (HEADER_VALUES).
// `.ci/rocm-sid-chroot` compiles it against the sid chroot's ROCm 6.4 and
// hipBLASLt 7.1 headers with the host's g++ and hands the output to the
// consts test. Host code only: nothing here needs or touches a GPU.
#define __HIP_PLATFORM_AMD__ 1
#include <cstddef>
#include <cstdio>
#include <hip/hip_runtime_api.h>
#include <hipblaslt/hipblaslt.h>

#define V(name) std::printf("%s %lld\n", #name, (long long)(name))
#define N(label, value) std::printf("%s %lld\n", label, (long long)(value))

int main() {
    V(hipSuccess); V(hipErrorNoDevice); V(hipErrorNotReady);
    V(hipEventDefault); V(hipEventDisableTiming);
    N("sizeof(hipDeviceProp_t)", sizeof(hipDeviceProp_t));
    N("hipDeviceProp_t.name", offsetof(hipDeviceProp_t, name));
    N("hipDeviceProp_t.totalGlobalMem", offsetof(hipDeviceProp_t, totalGlobalMem));
    N("hipDeviceProp_t.sharedMemPerBlock", offsetof(hipDeviceProp_t, sharedMemPerBlock));
    N("hipDeviceProp_t.multiProcessorCount", offsetof(hipDeviceProp_t, multiProcessorCount));
    N("hipDeviceProp_t.gcnArchName", offsetof(hipDeviceProp_t, gcnArchName));
    V(HIP_R_32F); V(HIP_R_16BF); V(HIP_R_8F_E4M3); V(HIP_R_8F_E5M2);
    V(HIP_R_4F_E2M1_EXT); V(HIP_R_8F_E4M3_FNUZ); V(HIP_R_8F_E5M2_FNUZ);
    V(HIPBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
    V(HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0);
    V(HIPBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F);
    V(HIPBLAS_COMPUTE_32F); V(HIPBLAS_OP_N); V(HIPBLAS_OP_T);
    V(HIPBLASLT_EPILOGUE_BIAS); V(HIPBLASLT_POINTER_MODE_DEVICE);
    N("sizeof(hipblasLtMatmulHeuristicResult_t)", sizeof(hipblasLtMatmulHeuristicResult_t));
    N("sizeof(hipblasLtMatmulAlgo_t)", sizeof(hipblasLtMatmulAlgo_t));
    N("hipblasLtMatmulHeuristicResult_t.state", offsetof(hipblasLtMatmulHeuristicResult_t, state));
    V(HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT); V(HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
    V(HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
    V(HIPBLASLT_MATMUL_DESC_TRANSA); V(HIPBLASLT_MATMUL_DESC_TRANSB);
    V(HIPBLASLT_MATMUL_DESC_EPILOGUE); V(HIPBLASLT_MATMUL_DESC_BIAS_POINTER);
    V(HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
    V(HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER); V(HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER);
    V(HIPBLASLT_MATMUL_DESC_A_SCALE_MODE); V(HIPBLASLT_MATMUL_DESC_B_SCALE_MODE);
    V(HIPBLASLT_MATMUL_DESC_POINTER_MODE);
    return 0;
}
