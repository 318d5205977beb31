// scripts/pair-ab's driver: times the baseline's and this checkout's allocate + deallocate pair
// alternately (the order swapped every round), `rounds` times per size, and prints per size
// the median and minimum over rounds of each side's time per pair, and in how many rounds this
// checkout's was lower. Usage: pair-ab ROUNDS
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

double pairs_base(std::size_t bytes, long n);
double pairs_head(std::size_t bytes, long n);

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  const long n = 2'000'000;  // about 50 ms a side: shorter than this VM's mode switches
  std::printf("%d rounds of %ld pairs a side, order swapped each round\n", rounds, n);
  std::printf("%9s %11s %11s %11s %11s %11s\n", "size", "base p50", "head p50", "base min", "head min", "head lower");
  for (std::size_t bytes : {std::size_t{256}, std::size_t{4096}, std::size_t{65536}, std::size_t{1} << 20}) {
    std::vector<double> base, head;
    int lower = 0;
    for (int r = 0; r < rounds; ++r) {
      double b, h;
      if (r % 2 == 0) {
        b = pairs_base(bytes, n);
        h = pairs_head(bytes, n);
      } else {
        h = pairs_head(bytes, n);
        b = pairs_base(bytes, n);
      }
      base.push_back(b);
      head.push_back(h);
      lower += h < b;
    }
    std::sort(base.begin(), base.end());
    std::sort(head.begin(), head.end());
    std::printf("%9zu %8.2f ns %8.2f ns %8.2f ns %8.2f ns %7d / %d\n", bytes, base[base.size() / 2], head[head.size() / 2],
                base.front(), head.front(), lower, rounds);
  }
}
