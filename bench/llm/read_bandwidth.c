/* Read bandwidth: T threads each sum their own buffer of 64-bit words, started together at a
 * barrier; the figure is all bytes read over the slowest thread's time, best of R passes.
 *
 *   cc -O3 -march=native -pthread read_bandwidth.c -o read_bandwidth && ./read_bandwidth T MIB R
 *
 * Summing (not copying) keeps it a pure read; -O3 -march=native vectorizes the loop with the
 * machine's widest loads, as a decoder's weight reads are. Prints one line per pass: seconds GB/s. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t words_per_thread;
static int passes;
static pthread_barrier_t start_line, finish_line;
static volatile uint64_t sink; /* keeps the sums alive */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static uint64_t sum_words(const uint64_t *p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

static void *reader(void *arg) {
  uint64_t *buf = malloc(words_per_thread * sizeof(uint64_t));
  if (!buf) { perror("malloc"); exit(1); }
  memset(buf, (int)(uintptr_t)arg, words_per_thread * sizeof(uint64_t)); /* fault the pages in */
  for (int r = 0; r < passes; ++r) {
    pthread_barrier_wait(&start_line);
    sink += sum_words(buf, words_per_thread);
    pthread_barrier_wait(&finish_line);
  }
  free(buf);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 4) { fprintf(stderr, "usage: %s THREADS MIB_PER_THREAD PASSES\n", argv[0]); return 2; }
  int threads = atoi(argv[1]);
  words_per_thread = (size_t)atol(argv[2]) * 1024 * 1024 / sizeof(uint64_t);
  passes = atoi(argv[3]);
  pthread_barrier_init(&start_line, NULL, threads + 1);
  pthread_barrier_init(&finish_line, NULL, threads + 1);
  pthread_t tid[64];
  for (int t = 0; t < threads; ++t) pthread_create(&tid[t], NULL, reader, (void *)(uintptr_t)(t + 1));
  double bytes = (double)threads * words_per_thread * sizeof(uint64_t);
  for (int r = 0; r < passes; ++r) {
    pthread_barrier_wait(&start_line);
    double t0 = now();
    pthread_barrier_wait(&finish_line);
    double s = now() - t0;
    printf("%.6f %.2f\n", s, bytes / s / 1e9);
  }
  for (int t = 0; t < threads; ++t) pthread_join(tid[t], NULL);
  return 0;
}
