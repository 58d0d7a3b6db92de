// ExecuTorch's program runner for the emulated Arm boards (benchmarks/arm_executorch.py builds it with the
// cross-compiler scripts/install.sh brings, against the libraries and headers of ExecuTorch's own aarch64 wheel).
//
//   runner PROGRAM.pte OUTPUT_PREFIX CALLS MARK_SYSCALL MARK_MAGIC INPUT0.bin [INPUT1.bin ...]
//
// Loads the program's "forward" the way ExecuTorch's C++ users do (a file data loader, the planned buffers the
// program asks for, malloc for the rest), on the calling thread only (the counts are per core),
// feeds each input from a file of raw bytes that must hold exactly what the program's input meta says, makes one
// warm-up call, writes each output's raw bytes to OUTPUT_PREFIX.N.bin, marks (syscall MARK_SYSCALL with
// MARK_MAGIC: the counting plugin's marks), marks again, makes CALLS calls, marks, and prints one JSON line with
// the outputs' dtypes and shapes. Any failure is a message on stderr and exit status 1.
#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/extension/threadpool/threadpool_guard.h>
#include <executorch/runtime/core/portable_type/tensor.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using executorch::extension::FileDataLoader;
using executorch::extension::MallocMemoryAllocator;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::HierarchicalAllocator;
using executorch::runtime::MemoryManager;
using executorch::runtime::Method;
using executorch::runtime::MethodMeta;
using executorch::runtime::Program;
using executorch::runtime::Span;

// The wheel ships no threadpool.h; these two are exported by its libexecutorch_threadpool.so. The kernels outside
// the XNNPACK delegate (a detector's head) run their parallel_for on this pool whatever NoThreadPoolGuard says, so
// the pool is cut to the calling thread (a one-thread pool runs its work inline).
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "executorch_runner: %s\n", what.c_str());
  std::exit(1);
}

void check(Error error, const std::string& what) {
  if (error != Error::Ok) {
    fail(what + " failed: error " + std::to_string(static_cast<int>(error)));
  }
}

// One input's storage and the TensorImpl over it: both must outlive the Method's use of them.
struct Input {
  std::vector<char> data;
  std::vector<TensorImpl::SizesType> sizes;
  std::vector<TensorImpl::DimOrderType> dim_order;
  std::vector<TensorImpl::StridesType> strides;
  std::unique_ptr<TensorImpl> impl;
};

std::vector<char> read_file(const char* path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    fail(std::string("cannot read ") + path);
  }
  return std::vector<char>(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

void mark(long number, long magic) {
  syscall(number, magic);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    fail("usage: runner PROGRAM.pte OUTPUT_PREFIX CALLS MARK_SYSCALL MARK_MAGIC INPUT.bin...");
  }
  const std::string output_prefix = argv[2];
  const long calls = std::strtol(argv[3], nullptr, 10);
  const long mark_number = std::strtol(argv[4], nullptr, 10);
  const long mark_magic = std::strtol(argv[5], nullptr, 10);
  executorch::extension::threadpool::NoThreadPoolGuard one_thread;  // XNNPACK then runs on this thread alone
  executorch::runtime::runtime_init();
  if (!executorch::extension::threadpool::get_threadpool()->_unsafe_reset_threadpool(1)) {
    fail("cannot cut ExecuTorch's thread pool to one thread");
  }

  auto loader = FileDataLoader::from(argv[1]);
  if (!loader.ok()) {
    fail(std::string("cannot open the program ") + argv[1]);
  }
  auto program = Program::load(&loader.get(), Program::Verification::Minimal);
  if (!program.ok()) {
    fail("Program::load failed: error " + std::to_string(static_cast<int>(program.error())));
  }
  auto meta = program->method_meta("forward");
  if (!meta.ok()) {
    fail("the program has no method 'forward'");
  }
  std::vector<std::vector<uint8_t>> planned(meta->num_memory_planned_buffers());
  std::vector<Span<uint8_t>> spans;
  for (size_t i = 0; i < planned.size(); ++i) {
    planned[i].resize(static_cast<size_t>(meta->memory_planned_buffer_size(i).get()));
    spans.emplace_back(planned[i].data(), planned[i].size());
  }
  HierarchicalAllocator planned_memory({spans.data(), spans.size()});
  MallocMemoryAllocator method_allocator;
  MallocMemoryAllocator temp_allocator;
  MemoryManager memory(&method_allocator, &planned_memory, &temp_allocator);
  auto method = program->load_method("forward", &memory);
  if (!method.ok()) {
    fail("load_method failed: error " + std::to_string(static_cast<int>(method.error())));
  }

  const size_t inputs_given = static_cast<size_t>(argc - 6);
  if (inputs_given != meta->num_inputs()) {
    fail("the program takes " + std::to_string(meta->num_inputs()) + " inputs, " + std::to_string(inputs_given) +
         " given");
  }
  std::vector<Input> inputs(inputs_given);
  for (size_t i = 0; i < inputs_given; ++i) {
    auto info = meta->input_tensor_meta(i);
    if (!info.ok()) {
      fail("input " + std::to_string(i) + " is not a tensor");
    }
    Input& input = inputs[i];
    input.data = read_file(argv[6 + i]);
    if (input.data.size() != info->nbytes()) {
      fail("input " + std::to_string(i) + " holds " + std::to_string(input.data.size()) + " bytes, the program " +
           "expects " + std::to_string(info->nbytes()));
    }
    input.sizes.assign(info->sizes().begin(), info->sizes().end());
    input.dim_order.assign(info->dim_order().begin(), info->dim_order().end());
    input.strides.assign(input.sizes.size(), 1);
    for (size_t d = input.sizes.size(); d-- > 1;) {  // contiguous in the program's dim order
      input.strides[input.dim_order[d - 1]] = input.strides[input.dim_order[d]] * input.sizes[input.dim_order[d]];
    }
    input.impl.reset(new TensorImpl(info->scalar_type(), static_cast<ssize_t>(input.sizes.size()),
                                    input.sizes.data(), input.data.data(), input.dim_order.data(),
                                    input.strides.data()));
    check(method->set_input(EValue(Tensor(input.impl.get())), i), "set_input " + std::to_string(i));
  }

  check(method->execute(), "the warm-up call");
  std::string described = "[";
  for (size_t i = 0; i < method->outputs_size(); ++i) {
    const EValue& value = method->get_output(i);
    if (!value.isTensor()) {
      fail("output " + std::to_string(i) + " is not a tensor");
    }
    const Tensor& tensor = value.toTensor();
    std::ofstream out(output_prefix + "." + std::to_string(i) + ".bin", std::ios::binary);
    out.write(static_cast<const char*>(tensor.const_data_ptr()), static_cast<std::streamsize>(tensor.nbytes()));
    if (!out) {
      fail("cannot write output " + std::to_string(i));
    }
    described += std::string(i ? ", " : "") + "{\"dtype\": " + std::to_string(static_cast<int>(tensor.scalar_type())) +
                 ", \"shape\": [";
    for (ssize_t d = 0; d < tensor.dim(); ++d) {
      described += std::string(d ? ", " : "") + std::to_string(tensor.size(d));
    }
    described += "]}";
  }
  mark(mark_number, mark_magic);
  mark(mark_number, mark_magic);
  for (long call = 0; call < calls; ++call) {
    check(method->execute(), "call " + std::to_string(call));
  }
  mark(mark_number, mark_magic);
  std::printf("{\"outputs\": %s]}\n", described.c_str());
  return 0;
}
