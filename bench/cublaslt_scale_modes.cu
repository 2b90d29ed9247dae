// Does this GPU's cuBLASLt run FP8 GEMMs with per-row (OUTER_VEC_32F) and
// 128-block (VEC128_32F, BLK128x128_32F) scales? For each pairing of scale
// modes it asks the heuristic for an algorithm, runs the GEMM on random E4M3
// operands and compares with a host reference under each plausible layout
// of the scale tensors, then times the GEMM at a Flux linear's shape beside
// a BF16 GEMM. Issue 18 asks this of sm_90.
//
//   nvcc -O2 -std=c++17 -o /tmp/scale_modes bench/cublaslt_scale_modes.cu -lcublasLt
//   /tmp/scale_modes
//
// Layouts: op(A) is [M, K] stored K-major (A^T column-major, TRANSA = T), B
// is [K, N] column-major (TRANSB = N), D is [M, N] column-major BF16.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#define CHECK_CUDA(x)                                                          \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__,      \
             __LINE__);                                                        \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static const char *mode_name(int m) {
  switch (m) {
  case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return "SCALAR_32F";
  case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return "OUTER_VEC_32F";
  case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return "VEC128_32F";
  case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return "BLK128x128_32F";
  default: return "?";
  }
}

// Number of f32 scales an operand with `outer` rows (M for A, N for B) and
// reduction length K needs in mode `m`.
static size_t scale_count(int m, int outer, int K) {
  int kb = (K + 127) / 128, ob = (outer + 127) / 128;
  switch (m) {
  case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return 1;
  case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return outer;
  case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return (size_t)kb * outer;
  case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return (size_t)kb * ob;
  }
  return 0;
}

// The scale of element (row r of `outer`, reduction index k) under layout
// hypothesis `outer_fast` (the outer index varies fastest) or not.
static float scale_of(const std::vector<float> &s, int m, int outer, int K,
                      int r, int k, bool outer_fast) {
  int kb = (K + 127) / 128, ob = (outer + 127) / 128;
  switch (m) {
  case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return s[0];
  case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return s[r];
  case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:
    return outer_fast ? s[(size_t)(k / 128) * outer + r]
                      : s[(size_t)r * kb + k / 128];
  case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:
    return outer_fast ? s[(size_t)(k / 128) * ob + r / 128]
                      : s[(size_t)(r / 128) * kb + k / 128];
  }
  return 0;
}

struct Gemm {
  cublasLtHandle_t lt;
  int M, N, K;
  int mode_a, mode_b;
  void *a, *b, *d, *sa, *sb, *ws;
  size_t ws_bytes;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulHeuristicResult_t heur{};

  // 0 when an algorithm was found, else the status or -1 for none.
  int plan(bool fp8) {
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F))
      return -2;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    if (fp8) {
      cublasLtMatmulMatrixScale_t ma = (cublasLtMatmulMatrixScale_t)mode_a,
                                  mb = (cublasLtMatmulMatrixScale_t)mode_b;
      int s1 = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma);
      int s2 = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb);
      if (s1 || s2) return s1 ? s1 : s2;
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    }
    cublasLtMatrixLayoutCreate(&la, in, K, M, K);
    cublasLtMatrixLayoutCreate(&lb, in, K, N, K);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, M, N, M);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
    int returned = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    return returned > 0 ? 0 : -1;
  }

  int run(cudaStream_t s) {
    float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld,
                          &heur.algo, ws, ws_bytes, s);
  }

  ~Gemm() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

static void *upload(const void *host, size_t bytes) {
  void *p;
  CHECK_CUDA(cudaMalloc(&p, bytes < 256 ? 256 : bytes));
  CHECK_CUDA(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
  return p;
}

static float time_ms(const std::function<int()> &f) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < 3; i++) f();
  std::vector<float> t;
  for (int rep = 0; rep < 7; rep++) {
    cudaEventRecord(e0);
    for (int i = 0; i < 10; i++) f();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    t.push_back(ms / 10);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, sm_%d%d, cuBLASLt %zu\n", prop.name, prop.major, prop.minor,
         cublasLtGetVersion());
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  size_t ws_bytes = 64 << 20;
  void *ws;
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));

  const int pairs[][2] = {
      {CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F},
      {CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F},
      {CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F},
      {CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F},
      {CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F},
  };

  // Correctness at a small shape with ragged-free multiples of 128.
  const int M = 256, N = 384, K = 512;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> val(-2.0f, 2.0f), sc(0.5f, 2.0f);
  std::vector<__nv_fp8_e4m3> ha(M * K), hb(N * K);
  std::vector<float> fa(M * K), fb(N * K);
  for (int i = 0; i < M * K; i++) { ha[i] = __nv_fp8_e4m3(val(rng)); fa[i] = float(ha[i]); }
  for (int i = 0; i < N * K; i++) { hb[i] = __nv_fp8_e4m3(val(rng)); fb[i] = float(hb[i]); }
  void *da = upload(ha.data(), ha.size()), *db = upload(hb.data(), hb.size());
  void *dd;
  CHECK_CUDA(cudaMalloc(&dd, (size_t)M * N * 2));

  printf("\n== correctness, M=%d N=%d K=%d (E4M3 operands, BF16 output)\n", M, N, K);
  for (auto &p : pairs) {
    int ma = p[0], mb = p[1];
    std::vector<float> sa(scale_count(ma, M, K)), sb(scale_count(mb, N, K));
    for (auto &x : sa) x = sc(rng);
    for (auto &x : sb) x = sc(rng);
    void *dsa = upload(sa.data(), sa.size() * 4), *dsb = upload(sb.data(), sb.size() * 4);
    Gemm g{lt, M, N, K, ma, mb, da, db, dd, dsa, dsb, ws, ws_bytes};
    int st = g.plan(true);
    printf("A %-15s B %-15s: ", mode_name(ma), mode_name(mb));
    if (st != 0) {
      printf("not supported (%s %d)\n", st == -1 ? "no algorithm" : "status", st);
      cudaFree(dsa); cudaFree(dsb);
      continue;
    }
    int rs = g.run(0);
    cudaError_t ce = cudaDeviceSynchronize();
    if (rs != 0 || ce != cudaSuccess) {
      printf("matmul failed (status %d, %s)\n", rs, cudaGetErrorString(ce));
      cudaGetLastError();
      cudaFree(dsa); cudaFree(dsb);
      continue;
    }
    std::vector<__nv_bfloat16> hd((size_t)M * N);
    CHECK_CUDA(cudaMemcpy(hd.data(), dd, hd.size() * 2, cudaMemcpyDeviceToHost));
    // Max relative error (against the largest |ref|) for each layout guess.
    double best = 1e30;
    std::string best_name;
    for (int ga = 0; ga < 2; ga++) for (int gb = 0; gb < 2; gb++) {
      double err = 0, big = 0;
      for (int n = 0; n < N; n++) for (int m = 0; m < M; m++) {
        double acc = 0;
        for (int k = 0; k < K; k++)
          acc += (double)fa[m * K + k] * scale_of(sa, ma, M, K, m, k, ga) *
                 fb[n * K + k] * scale_of(sb, mb, N, K, n, k, gb);
        double got = __bfloat162float(hd[(size_t)n * M + m]);
        err = std::max(err, std::fabs(got - acc));
        big = std::max(big, std::fabs(acc));
      }
      double rel = err / big;
      if (rel < best) {
        best = rel;
        best_name = std::string(ga ? "A outer-fast" : "A k-block-fast") + ", " +
                    (gb ? "B outer-fast" : "B k-block-fast");
      }
    }
    printf("runs; max error / max |ref| = %.2e (scales %s)%s\n", best,
           best_name.c_str(), best < 1e-2 ? "" : "  <- MISMATCH under every layout tried");
    cudaFree(dsa); cudaFree(dsb);
  }

  // Speed at a Flux linear: x [16384, 3072] times W [12288, 3072]^T.
  const int TM = 16384, TN = 12288, TK = 3072;
  printf("\n== time, M=%d N=%d K=%d, median of 7 x 10 calls\n", TM, TN, TK);
  void *ta, *tb, *td;
  CHECK_CUDA(cudaMalloc(&ta, (size_t)TM * TK * 2));
  CHECK_CUDA(cudaMalloc(&tb, (size_t)TN * TK * 2));
  CHECK_CUDA(cudaMalloc(&td, (size_t)TM * TN * 2));
  CHECK_CUDA(cudaMemset(ta, 0x3c, (size_t)TM * TK * 2));
  CHECK_CUDA(cudaMemset(tb, 0x3c, (size_t)TN * TK * 2));
  Gemm bf{lt, TM, TN, TK, 0, 0, ta, tb, td, nullptr, nullptr, ws, ws_bytes};
  double flops = 2.0 * TM * TN * TK;
  float t_bf16 = 0;
  if (bf.plan(false) == 0) {
    t_bf16 = time_ms([&] { return bf.run(0); });
    printf("BF16                              : %.3f ms (%.0f TFLOP/s)\n", t_bf16, flops / t_bf16 / 1e9);
  }
  for (auto &p : pairs) {
    int ma = p[0], mb = p[1];
    std::vector<float> sa(scale_count(ma, TM, TK), 1.0f), sb(scale_count(mb, TN, TK), 1.0f);
    void *dsa = upload(sa.data(), sa.size() * 4), *dsb = upload(sb.data(), sb.size() * 4);
    Gemm g{lt, TM, TN, TK, ma, mb, ta, tb, td, dsa, dsb, ws, ws_bytes};
    printf("A %-15s B %-15s: ", mode_name(ma), mode_name(mb));
    if (g.plan(true) != 0) {
      printf("not supported\n");
    } else {
      float t = time_ms([&] { return g.run(0); });
      printf("%.3f ms (%.0f TFLOP/s, %.2fx BF16)\n", t, flops / t / 1e9, t_bf16 / t);
    }
    cudaFree(dsa); cudaFree(dsb);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  return 0;
}
