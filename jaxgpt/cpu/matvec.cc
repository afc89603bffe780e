// y (N, M) float32 = x (N, K) float32 times w (M, K) bfloat16, transposed: a decode step's dense
// layer on the CPU, as an XLA FFI custom call (jaxgpt/cpu/matvec.py builds this file and binds it).
//
// Why it exists: XLA:CPU has no bfloat16 matrix-vector product. It upcasts a bfloat16 weight to
// float32 at every call, or runs a float32 dot on float32 copies, so a bfloat16 model decoded
// reading as many bytes as a float32 one. A decode step is a few rows against every weight of
// the model, so its time is the time to read the weights: here each weight is read once per
// call, as bfloat16 (half the bytes), widened to float32 in registers (a bfloat16 is the top 16
// bits of a float32), multiplied and summed in float32.
//
// Layout: w's rows are the output features, so every output is one contiguous dot product and
// a thread streams whole rows. The N rows of x are reused from cache for each weight row, in
// tiles of up to 4 rows whose partial sums stay in registers. Rows of w are split into chunks
// that XLA's own CPU thread pool and the calling thread take in turn.
//
// The result of each output is one fixed sequence of float32 operations, whichever thread runs
// it: calls are deterministic.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>

#include "xla/ffi/api/ffi.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

namespace {

// Eight float32 lanes: AVX2 with FMA where the compiler targets it (-march=native on x86-64),
// else the compiler's generic vectors (NEON, SSE), the same operations in the same order.
#if defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec load_x(const float* p) { return _mm256_loadu_ps(p); }
inline Vec load_w(const uint16_t* p) {  // 8 bfloat16 -> float32: zero-extend, shift into the top half
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
#else
typedef float Vec __attribute__((vector_size(32)));
typedef uint32_t Vec32 __attribute__((vector_size(32)));
typedef uint16_t Vec16 __attribute__((vector_size(16)));
inline Vec zero() { return Vec{}; }
inline Vec load_x(const float* p) { Vec v; std::memcpy(&v, p, sizeof v); return v; }
inline Vec load_w(const uint16_t* p) {
  Vec16 h;
  std::memcpy(&h, p, sizeof h);
  Vec32 u = __builtin_convertvector(h, Vec32) << 16;
  Vec v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}
inline Vec fma(Vec a, Vec b, Vec c) { return a * b + c; }
inline Vec add(Vec a, Vec b) { return a + b; }
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
#endif

constexpr int64_t kLanes = 8;

inline float widen(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float lanes_sum(Vec v) {  // pairwise, as a fixed tree
  float s[kLanes];
  store(s, v);
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

// One weight row against NB rows of x: NB x kUnroll independent sums (kUnroll splits K, so that
// even one row keeps several multiply-adds in flight). y gets y[n * M] for n < NB. The sums of a
// row of x are the same whatever NB is: a row's outputs do not depend on the rows beside it.
constexpr int kUnroll = 2;

template <int NB>
void row_tile(const float* x, int64_t K, const uint16_t* w, float* y, int64_t M) {
  Vec acc[NB][kUnroll];
  for (auto& row : acc)
    for (auto& a : row) a = zero();
  int64_t k = 0;
  for (; k + kUnroll * kLanes <= K; k += kUnroll * kLanes) {
    // Ask for the weights 2 KiB ahead (the rest of this row, then the next: a thread's rows are
    // contiguous) while these are multiplied: 5-10% faster than the hardware prefetcher alone.
    __builtin_prefetch(w + k + 1024);
    for (int u = 0; u < kUnroll; ++u) {
      Vec wv = load_w(w + k + u * kLanes);
      for (int n = 0; n < NB; ++n) acc[n][u] = fma(wv, load_x(x + n * K + k + u * kLanes), acc[n][u]);
    }
  }
  for (; k + kLanes <= K; k += kLanes) {
    Vec wv = load_w(w + k);
    for (int n = 0; n < NB; ++n) acc[n][0] = fma(wv, load_x(x + n * K + k), acc[n][0]);
  }
  for (int n = 0; n < NB; ++n) {
    Vec v = acc[n][0];
    for (int u = 1; u < kUnroll; ++u) v = add(v, acc[n][u]);
    float s = lanes_sum(v);
    for (int64_t j = k; j < K; ++j) s += widen(w[j]) * x[n * K + j];
    y[n * M] = s;
  }
}

// Outputs m0..m1 of every row of x.
void rows(const float* x, int64_t N, int64_t K, const uint16_t* w, int64_t M, int64_t m0, int64_t m1, float* y) {
  for (int64_t m = m0; m < m1; ++m) {
    const uint16_t* wm = w + m * K;  // stays in L1 while the tiles of x pass over it
    int64_t n = 0;
    for (; n + 4 <= N; n += 4) row_tile<4>(x + n * K, K, wm, y + n * M + m, M);
    switch (N - n) {
      case 3: row_tile<3>(x + n * K, K, wm, y + n * M + m, M); break;
      case 2: row_tile<2>(x + n * K, K, wm, y + n * M + m, M); break;
      case 1: row_tile<1>(x + n * K, K, wm, y + n * M + m, M); break;
      default: break;
    }
  }
}

// The rows of w in chunks, taken in turn by whoever runs work(): the calling thread and the
// tasks it scheduled. Shared ownership: a task that starts after the last chunk is done (XLA
// may run it late, or on the caller's thread) finds nothing to do and touches no freed memory.
struct Job {
  const float* x;
  const uint16_t* w;
  float* y;
  int64_t N, K, M, chunk, chunks;
  std::atomic<int64_t> next{0}, done{0};

  void work() {
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      rows(x, N, K, w, M, c * chunk, std::min(M, (c + 1) * chunk), y);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error Matvec(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::BF16> w,
                  ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error::InvalidArgument("jaxgpt_bf16_matvec: need x (N, K) and w (M, K)");
  auto job = std::make_shared<Job>();
  job->x = x.typed_data();
  job->w = reinterpret_cast<const uint16_t*>(w.typed_data());
  job->y = y->typed_data();
  job->N = xd[0];
  job->K = xd[1];
  job->M = wd[0];
  // A few chunks per thread, so that a thread that starts late or runs slow costs little; at
  // least 16 KiB of weights each, so that small layers are not cut into crumbs.
  int64_t threads = std::max<int64_t>(1, pool.num_threads());
  int64_t min_rows = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, job->K));
  job->chunk = std::max(min_rows, (job->M + 4 * threads - 1) / (4 * threads));
  job->chunks = (job->M + job->chunk - 1) / job->chunk;
  for (int64_t t = 1; t < std::min(threads, job->chunks); ++t) pool.Schedule([job] { job->work(); });
  job->work();
  // Every chunk is taken by now; wait for the ones other threads are still computing.
  while (job->done.load(std::memory_order_acquire) < job->chunks) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxgpt_bf16_matvec, Matvec,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
