// SPDX-License-Identifier: Apache-2.0
// The C++ half of the safetensors interop test (driven by tests/io/safetensors_interop.py):
//   checkpoint_interop write <dir>   saves checkpoints of every head kind and of sparse Adam under
//                                    <dir>/cpp/<name>/, and <dir>/cpp/reference.txt listing every
//                                    tensor's values ("<name>/<file>:<tensor> <value> ...", floats
//                                    as C99 hex floats) for Python to compare with what it reads;
//   checkpoint_interop read <dir>    loads the checkpoint Python wrote in <dir>/python/ (F32
//                                    weights, F16 bias) into an fp32 and a bf16 full_softmax and
//                                    checks them against <dir>/python/expected.txt (hex floats).
// Exit code 0 when every check passes; a message on stderr otherwise.

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/io/checkpoint.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace xs = xsoftmax;
using xs::index_t;
using head32 = xs::full_softmax<xs::fp32, xs::serial>;

std::string hex(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

/// Appends every tensor of `file` to the reference, values as the file holds them.
void describe(std::ostream& out, const std::string& label, const std::string& file) {
  const auto f = xs::io::safetensors_file::read(file);
  for (const auto& t : f.tensors()) {
    out << label << ":" << t.name;
    if (xs::io::is_floating(t.type))
      for (const float v : f.values<float>(t.name, t.shape)) out << ' ' << hex(v);
    else
      for (const auto v : f.values<std::int64_t>(t.name, t.shape)) out << ' ' << v;
    out << '\n';
  }
}

int write_checkpoints(const std::string& dir) {
  const std::string root = dir + "/cpp";
  std::ofstream ref(root + "/reference.txt");
  if (!ref) {
    std::cerr << "cannot write " << root << "/reference.txt (create " << root << " first)\n";
    return 1;
  }
  const auto record = [&](const std::string& name) {
    describe(ref, name + "/head", root + "/" + name + "/" + xs::checkpoint_head_file);
    std::ifstream opt(root + "/" + name + "/" + xs::checkpoint_optimizer_file);
    if (opt) describe(ref, name + "/optimizer", root + "/" + name + "/" + xs::checkpoint_optimizer_file);
  };

  // fp32 full head with bias and sparse Adam after two steps.
  head32 full(11, 5, true);
  xs::sparse_adam<xs::serial> adam(11, 5, true);
  for (int s = 0; s < 2; ++s) {
    xs::sparse_gradient<xs::serial, float> g;
    g.dim = 5;
    for (index_t r = s; r < 11; r += 1 + s) {  // every row, then the odd ones
      g.rows.push_back(r);
      g.bias_values.push_back(0.25f * static_cast<float>(r - 5));
      for (index_t c = 0; c < 5; ++c) g.values.push_back(0.1f * static_cast<float>(r - c));
    }
    adam.step(full, g, 0.05f);
  }
  xs::save_checkpoint(root + "/full", full, adam);
  record("full");

  xs::full_softmax<xs::fp16, xs::serial> half(9, 4, true);
  xs::save_checkpoint(root + "/full16", half);
  record("full16");

  std::vector<double> counts;
  for (int c = 0; c < 13; ++c) counts.push_back(100.0 / (c + 1));
  xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::serial> hs(xs::runtime_tree<>::huffman(counts), 3);
  xs::save_checkpoint(root + "/hs", hs);
  record("hs");

  xs::knn_options options;
  options.graph.k = 4;
  xs::knn_softmax<xs::fp32, xs::serial> knn(15, 6, options);
  xs::save_checkpoint(root + "/knn", knn);
  record("knn");
  return ref.good() ? 0 : 1;
}

template <class Head>
int check_loaded(const Head& head, const std::vector<float>& expected_w, const std::vector<float>& expected_b,
                 const char* what) {
  using T = typename Head::storage_type;
  const auto w = head.weights();
  for (index_t i = 0; i < w.rows * w.cols; ++i) {
    const T want = xs::from_float<T>(expected_w[static_cast<std::size_t>(i)]);
    if (std::memcmp(&w.data[i], &want, sizeof(T)) != 0) {
      std::cerr << what << ": weight element " << i << " is " << xs::to_float(w.data[i]) << ", expected "
                << xs::to_float(want) << "\n";
      return 1;
    }
  }
  for (index_t r = 0; r < w.rows; ++r)
    if (xs::to_float(head.bias()[r]) != xs::to_float(xs::from_float<T>(expected_b[static_cast<std::size_t>(r)]))) {
      std::cerr << what << ": bias " << r << " differs\n";
      return 1;
    }
  return 0;
}

int read_python_checkpoint(const std::string& dir) {
  const std::string root = dir + "/python";
  std::ifstream in(root + "/expected.txt");
  std::string line, word;
  std::vector<float> w, b;
  index_t n = 0, d = 0;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    s >> word;
    if (word == "shape") s >> n >> d;
    std::vector<float>& into = word == "weight" ? w : b;
    if (word == "weight" || word == "bias")
      while (s >> word) into.push_back(static_cast<float>(std::strtod(word.c_str(), nullptr)));
  }
  if (n < 1 || static_cast<index_t>(w.size()) != n * d || static_cast<index_t>(b.size()) != n) {
    std::cerr << "bad or missing " << root << "/expected.txt\n";
    return 1;
  }
  head32 exact(n, d, true);
  xs::load_checkpoint(root, exact);
  xs::full_softmax<xs::bf16, xs::serial> rounded(n, d, true);
  xs::load_checkpoint(root, rounded);
  if (check_loaded(exact, w, b, "fp32 head") || check_loaded(rounded, w, b, "bf16 head")) return 1;
  std::cout << "loaded Python's checkpoint (" << n << " x " << d << ") into fp32 and bf16 heads\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: checkpoint_interop write|read <dir>\n";
    return 2;
  }
  try {
    const std::string mode = argv[1];
    if (mode == "write") return write_checkpoints(argv[2]);
    if (mode == "read") return read_python_checkpoint(argv[2]);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  std::cerr << "unknown mode " << argv[1] << "\n";
  return 2;
}
