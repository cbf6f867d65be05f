// Host time of one cuBLASLt GEMM launched from C++ the way Transformer Engine launches each expert's GEMM in
// its grouped GEMM: the mechanism behind `host.library_kernel_s` in simulator/frameworks/*.yaml.
//
// Transformer Engine (v2.4 .. v2.9, transformer_engine/common/gemm/cublaslt_gemm.cu, cublas_gemm()) does, for
// every GEMM of multi_stream_cublas_gemm's loop: cublasLtMatrixLayoutCreate x 4 (A, B, C, D),
// cublasLtMatmulDescCreate with TRANSA / TRANSB (and EPILOGUE) attributes, cublasLtMatmulPreferenceCreate with
// the workspace size and the four operand alignments, cublasLtMatmulAlgoGetHeuristic (cuBLASLt answers a
// repeated question from its own heuristics cache), cublasLtMatmul on one of the compute streams, then the six
// destroys. This program replays exactly that sequence ("te") and, to split it, the launch alone with
// descriptors and algorithm prepared once ("cached"), the heuristic query alone ("heuristic"), and an empty
// kernel launch ("empty_kernel").
//
// The GPU is kept busy by a sleeping kernel queued first, so every timed call returns as soon as the host has
// enqueued it: the wall time per call is host time. Calls are timed in batches of 128 (well under the launch
// queue's depth) after a warm-up; the median batch is reported.
//
//     nvcc -O2 -std=c++17 -arch=sm_90 benchmarks/cublaslt_launch.cu -lcublasLt -o /tmp/cublaslt_launch
//     /tmp/cublaslt_launch            # one JSON line per case on stdout

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(x)                                                               \
  do {                                                                              \
    cudaError_t e = (x);                                                            \
    if (e != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)
#define CHECK_LT(x)                                                                 \
  do {                                                                              \
    cublasStatus_t s = (x);                                                         \
    if (s != CUBLAS_STATUS_SUCCESS) {                                               \
      std::fprintf(stderr, "%s:%d cublas status %d\n", __FILE__, __LINE__, (int)s); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

__global__ void sleep_kernel(long long ns) {
  long long start = clock64();
  // about 1.7 GHz on an H100 SXM at its boost clock: cycles are an upper bound on the time asked for
  while (clock64() - start < ns * 2) {
  }
}
__global__ void empty_kernel() {}

struct Gemm {
  int m, n, k;  // D[m, n] = A[m, k] x B[k, n] in cuBLAS's column-major terms
  void *A, *B, *D, *workspace;
  size_t workspace_bytes = 32 << 20;  // TE's workspace: 32 MiB on Hopper (module/base.py get_cublas_workspace_size_bytes)
};

static uint32_t alignment(const void *p) {
  uint32_t a = 256;
  while (reinterpret_cast<uintptr_t>(p) % a) a /= 2;
  return a;
}

// One GEMM exactly as TE's cublas_gemm() issues it (bf16 in and out, fp32 compute, no epilogue, TN).
static void te_gemm(cublasLtHandle_t handle, const Gemm &g, cudaStream_t stream) {
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatrixLayout_t Ad, Bd, Cd, Dd;
  cublasLtMatmulDesc_t op;
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulHeuristicResult_t heur = {};
  int returned = 0;
  CHECK_LT(cublasLtMatrixLayoutCreate(&Ad, CUDA_R_16BF, g.k, g.m, g.k));
  CHECK_LT(cublasLtMatrixLayoutCreate(&Bd, CUDA_R_16BF, g.k, g.n, g.k));
  CHECK_LT(cublasLtMatrixLayoutCreate(&Dd, CUDA_R_16BF, g.m, g.n, g.m));
  CHECK_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  CHECK_LT(cublasLtMatrixLayoutCreate(&Cd, CUDA_R_16BF, g.m, g.n, g.m));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &g.workspace_bytes, sizeof(g.workspace_bytes)));
  uint32_t aa = alignment(g.A), ab = alignment(g.B), ad = alignment(g.D);
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa)));
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab)));
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof(ad)));
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad)));
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(handle, op, Ad, Bd, Cd, Dd, pref, 1, &heur, &returned));
  if (!returned) {
    std::fprintf(stderr, "no cuBLASLt algorithm for %d x %d x %d\n", g.m, g.n, g.k);
    std::exit(1);
  }
  float one = 1.f, zero = 0.f;
  CHECK_LT(cublasLtMatmul(handle, op, &one, g.A, Ad, g.B, Bd, &zero, g.D, Cd, g.D, Dd, &heur.algo, g.workspace,
                          g.workspace_bytes, stream));
  CHECK_LT(cublasLtMatmulPreferenceDestroy(pref));
  CHECK_LT(cublasLtMatrixLayoutDestroy(Dd));
  CHECK_LT(cublasLtMatrixLayoutDestroy(Cd));
  CHECK_LT(cublasLtMatrixLayoutDestroy(Bd));
  CHECK_LT(cublasLtMatrixLayoutDestroy(Ad));
  CHECK_LT(cublasLtMatmulDescDestroy(op));
}

struct Prepared {  // descriptors and algorithm built once: what a launch alone costs
  cublasLtMatrixLayout_t Ad, Bd, Dd;
  cublasLtMatmulDesc_t op;
  cublasLtMatmulHeuristicResult_t heur;
  cublasLtMatmulPreference_t pref;
};

static Prepared prepare(cublasLtHandle_t handle, const Gemm &g) {
  Prepared p{};
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  int returned = 0;
  CHECK_LT(cublasLtMatrixLayoutCreate(&p.Ad, CUDA_R_16BF, g.k, g.m, g.k));
  CHECK_LT(cublasLtMatrixLayoutCreate(&p.Bd, CUDA_R_16BF, g.k, g.n, g.k));
  CHECK_LT(cublasLtMatrixLayoutCreate(&p.Dd, CUDA_R_16BF, g.m, g.n, g.m));
  CHECK_LT(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CHECK_LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CHECK_LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  CHECK_LT(cublasLtMatmulPreferenceCreate(&p.pref));
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(p.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &g.workspace_bytes, sizeof(g.workspace_bytes)));
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.Ad, p.Bd, p.Dd, p.Dd, p.pref, 1, &p.heur, &returned));
  return p;
}

template <class F>
static double median_us_per_call(F call, cudaStream_t stream, int batch = 128, int batches = 15) {
  std::vector<double> per_call;
  for (int b = 0; b < batches + 2; ++b) {
    sleep_kernel<<<1, 1, 0, stream>>>(20'000'000);  // 20 ms of GPU work ahead of the batch
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) call(i);
    auto t1 = std::chrono::steady_clock::now();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (b >= 2) per_call.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / batch);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

int main() {
  cublasLtHandle_t handle;
  CHECK_LT(cublasLtCreate(&handle));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"device\": \"%s\", \"cublasLt\": %zu}\n", prop.name, cublasLtGetVersion());

  double empty = median_us_per_call([&](int) { empty_kernel<<<1, 1, 0, stream>>>(); }, stream);
  std::printf("{\"case\": \"empty_kernel\", \"us_per_call\": %.3f}\n", empty);

  // Expert GEMMs of the shipped MoE layouts (rows per expert, hidden, expert width): fc1 forward.
  struct Shape {
    const char *name;
    int rows, k, n;
  };
  std::vector<Shape> shapes = {{"qwen3-235b ETP4 fc1", 512, 4096, 768},
                               {"qwen3-30b fc1", 1024, 2048, 1536},
                               {"deepseek-v3 fc1", 2048, 7168, 4096},
                               {"tiny", 128, 256, 256}};
  for (const Shape &s : shapes) {
    Gemm g{s.n, s.rows, s.k};  // cuBLAS column-major: D^T[n, rows] = W^T x X^T, as TE calls it (TN)
    CHECK_CUDA(cudaMalloc(&g.A, size_t(g.m) * g.k * 2));
    CHECK_CUDA(cudaMalloc(&g.B, size_t(g.k) * g.n * 2));
    CHECK_CUDA(cudaMalloc(&g.D, size_t(g.m) * g.n * 2));
    CHECK_CUDA(cudaMalloc(&g.workspace, g.workspace_bytes));
    CHECK_CUDA(cudaMemset(g.A, 0, size_t(g.m) * g.k * 2));
    CHECK_CUDA(cudaMemset(g.B, 0, size_t(g.k) * g.n * 2));
    te_gemm(handle, g, stream);  // first call fills cuBLASLt's heuristics cache, as a training step's warm-up does
    CHECK_CUDA(cudaStreamSynchronize(stream));
    Prepared p = prepare(handle, g);
    float one = 1.f, zero = 0.f;
    double te = median_us_per_call([&](int) { te_gemm(handle, g, stream); }, stream);
    double cached = median_us_per_call(
        [&](int) {
          CHECK_LT(cublasLtMatmul(handle, p.op, &one, g.A, p.Ad, g.B, p.Bd, &zero, g.D, p.Dd, g.D, p.Dd, &p.heur.algo,
                                  g.workspace, g.workspace_bytes, stream));
        },
        stream);
    double heuristic = median_us_per_call(
        [&](int) {
          cublasLtMatmulHeuristicResult_t h;
          int r = 0;
          CHECK_LT(cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.Ad, p.Bd, p.Dd, p.Dd, p.pref, 1, &h, &r));
        },
        stream);
    std::printf(
        "{\"case\": \"%s\", \"rows\": %d, \"k\": %d, \"n\": %d, \"te_us\": %.3f, \"cached_launch_us\": %.3f, "
        "\"heuristic_us\": %.3f}\n",
        s.name, s.rows, s.k, s.n, te, cached, heuristic);
    cudaFree(g.A);
    cudaFree(g.B);
    cudaFree(g.D);
    cudaFree(g.workspace);
  }
  return 0;
}
