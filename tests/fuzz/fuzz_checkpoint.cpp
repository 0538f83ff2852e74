// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the checkpoint loaders (tests/fuzz/README.md): a checkpoint is a file from
// somewhere else, so its reader must survive any byte string.
//
// The first input byte picks the file the rest of the input becomes, in a fresh directory, and the
// loaders that read it:
//   0. head.safetensors: safetensors_file::parse, load_checkpoint into a full softmax (with bias),
//      into a hierarchical softmax over a runtime tree, and load_runtime_tree;
//   1. head.safetensors of a good full softmax checkpoint beside it, the input as
//      optimizer.safetensors: load_checkpoint with a sparse Adam (steps, update counts, state);
//   2. manifest.safetensors: read_sharded_checkpoint_layout and load_sharded_checkpoint.
// A loader may succeed or throw one of the library's typed errors; anything else (a crash, a
// sanitizer report, another exception type, bad_alloc, a failed load that changed the head or the
// optimizer) aborts the run. Every file is a safetensors file: the seed corpus (`--make-corpus DIR`)
// holds real checkpoints of each kind, prefixed with their selector byte.

#include "support/small_gradient.hpp"

#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/io/checkpoint.hpp>
#include <xsoftmax/io/sharded_checkpoint.hpp>
#include <xsoftmax/optim/sparse_optimizer.hpp>
#include <xsoftmax/sharding/class_sharding.hpp>
#include <xsoftmax/sharding/solo_communicator.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace xs = xsoftmax;
namespace fs = std::filesystem;
using xs::index_t;

namespace {

constexpr index_t classes = 12, dim = 3;

[[noreturn]] void contract_broken(const char* what) {
  std::fprintf(stderr, "fuzz_checkpoint: %s\n", what);
  std::abort();
}

/// Runs f; the library's typed errors are fine, anything else is a finding.
template <class F>
bool probe(F&& f) {
  try {
    f();
    return true;
  } catch (const xs::checkpoint_error&) {
  } catch (const xs::shape_error&) {
  } catch (const xs::out_of_range&) {
  } catch (const xs::non_finite_error&) {
  } catch (const xs::invalid_argument&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_checkpoint: unexpected exception: %s\n", e.what());
    std::abort();
  }
  return false;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string bits(const float* p, index_t n) { return std::string(reinterpret_cast<const char*>(p), sizeof(float) * n); }

xs::runtime_tree<> small_tree() {
  std::vector<double> counts(static_cast<std::size_t>(classes));
  for (index_t c = 0; c < classes; ++c) counts[static_cast<std::size_t>(c)] = 1.0 + static_cast<double>(c % 5);
  return xs::runtime_tree<>::huffman(counts, 3);
}

/// A scratch directory per process, emptied for each input.
const fs::path& scratch() {
  static const fs::path dir = fs::temp_directory_path() / ("xsoftmax_fuzz_checkpoint_" + std::to_string(::getpid()));
  return dir;
}

void fresh_scratch() {
  std::error_code ignored;
  fs::remove_all(scratch(), ignored);
  fs::create_directories(scratch());
}

void fuzz_head_file(const std::string& file) {
  (void)probe([&] { (void)xs::io::safetensors_file::parse(file, "input"); });
  write(scratch() / xs::checkpoint_head_file, file);
  xs::full_softmax<xs::fp32, xs::serial> full(classes, dim, true, xs::init_options{1});
  const std::string w0 = bits(full.weights().data, classes * dim), b0 = bits(full.bias(), classes);
  if (!probe([&] { xs::load_checkpoint(scratch().string(), full); }) &&
      (bits(full.weights().data, classes * dim) != w0 || bits(full.bias(), classes) != b0))
    contract_broken("a failed load_checkpoint changed the full softmax");
  xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::serial> hs(small_tree(), dim);
  const std::string h0 = bits(hs.weights().data, hs.weights().rows * dim);
  if (!probe([&] { xs::load_checkpoint(scratch().string(), hs); }) && bits(hs.weights().data, hs.weights().rows * dim) != h0)
    contract_broken("a failed load_checkpoint changed the hierarchical softmax");
  (void)probe([&] { (void)xs::load_runtime_tree(scratch().string()); });
}

void fuzz_optimizer_file(const std::string& file, const std::string& good_head) {
  write(scratch() / xs::checkpoint_head_file, good_head);
  write(scratch() / xs::checkpoint_optimizer_file, file);
  xs::full_softmax<xs::fp32, xs::serial> head(classes, dim, true, xs::init_options{2});
  xs::sparse_adam<xs::serial> adam(classes, dim, true);
  const std::string w0 = bits(head.weights().data, classes * dim);
  if (probe([&] { xs::load_checkpoint(scratch().string(), head, adam); })) {
    // A loaded optimizer must be able to step: counts it accepted cannot overflow.
    (void)probe([&] { adam.step(head, xsoftmax_test::small_gradient<xs::serial>(dim, {0, classes - 1}, 0.5f), 0.01f); });
  } else if (bits(head.weights().data, classes * dim) != w0 || adam.steps() != 0) {
    contract_broken("a failed load_checkpoint changed the head or the optimizer");
  }
}

void fuzz_manifest(const std::string& file) {
  write(scratch() / xs::sharded_checkpoint_manifest_file, file);
  (void)probe([&] { (void)xs::read_sharded_checkpoint_layout(scratch().string()); });
  xs::full_softmax<xs::fp32, xs::serial> full(classes, dim, true, xs::init_options{3});
  (void)probe([&] { xs::load_sharded_checkpoint(scratch().string(), full); });
}

/// A good checkpoint of each kind, for the optimizer probe's head file and the seed corpus.
struct good_files {
  std::string full_head, hs_head, optimizer, manifest;
  good_files() {
    fresh_scratch();
    const std::string dir = scratch().string();
    xs::full_softmax<xs::fp32, xs::serial> full(classes, dim, true, xs::init_options{4});
    xs::sparse_adam<xs::serial> adam(classes, dim, true);
    adam.step(full, xsoftmax_test::small_gradient<xs::serial>(dim, {1, 5}, 0.25f), 0.01f);
    xs::save_checkpoint(dir, full, adam);
    full_head = read(scratch() / xs::checkpoint_head_file);
    optimizer = read(scratch() / xs::checkpoint_optimizer_file);
    xs::hierarchical_softmax<xs::runtime_tree<>, xs::fp32, xs::serial> hs(small_tree(), dim);
    xs::save_checkpoint(dir, hs);
    hs_head = read(scratch() / xs::checkpoint_head_file);
    fresh_scratch();
    xs::save_sharded_checkpoint(dir, xs::full_softmax<xs::fp32, xs::serial, xs::class_sharding<xs::solo_communicator>>(
                                         xs::class_sharding<xs::solo_communicator>({}, classes), dim, true));
    manifest = read(scratch() / xs::sharded_checkpoint_manifest_file);
  }
};

const good_files& good() {
  static const good_files g;
  return g;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // `fuzz_checkpoint --make-corpus DIR`: the seed corpus, then exit.
  for (int i = 1; i + 1 < *argc; ++i)
    if (std::string((*argv)[i]) == "--make-corpus") {
      const fs::path dir = (*argv)[i + 1];
      fs::create_directories(dir);
      write(dir / "full_head", std::string(1, '\0') + good().full_head);
      write(dir / "hs_head", std::string(1, '\0') + good().hs_head);
      write(dir / "optimizer", std::string(1, '\1') + good().optimizer);
      write(dir / "manifest", std::string(1, '\2') + good().manifest);
      std::exit(0);
    }
  (void)good();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  fresh_scratch();
  switch (data[0] % 3) {
    case 0: fuzz_head_file(file); break;
    case 1: fuzz_optimizer_file(file, good().full_head); break;
    default: fuzz_manifest(file); break;
  }
  return 0;
}
