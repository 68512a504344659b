#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "families.hpp"
#include "kernel_cache_impl.hpp"
#include "log.hpp"

namespace flashjit {

std::string_view version() { return FLASHJIT_VERSION; }

namespace detail {

std::string content_key(const KeyInputs& inputs) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  auto feed = [&](std::string_view text) {
    XXH3_128bits_update(state, text.data(), text.size());
    XXH3_128bits_update(state, "\0", 1);
  };
  feed(inputs.flashjit_version);
  feed(inputs.nvrtc_version);
  feed(inputs.variant_name);
  feed(inputs.name_expression);
  for (const auto& option : inputs.options) feed(option);
  for (const auto& file : inputs.sources) {
    feed(file.path);
    feed(file.text);
  }
  const XXH128_hash_t hash = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}{:016x}", hash.high64, hash.low64);
}

}  // namespace detail

std::string KernelCache::Impl::key_for(const Variant& variant) {
  const auto& traits = detail::family_traits(variant.family);
  detail::KeyInputs inputs{std::string(version()), nvrtc_version(), variant.name(),
                           detail::name_expression(variant), detail::nvrtc_options(variant), {}};
  std::lock_guard lock(mutex);
  auto it = units.find(std::string(traits.source_file));
  if (it == units.end())
    it = units.emplace(traits.source_file,
                       detail::kernel_translation_unit(std::string(traits.source_file)))
             .first;
  inputs.sources = it->second;
  return detail::content_key(inputs);
}

std::shared_ptr<const detail::CompiledKernel> KernelCache::Impl::get(const Variant& variant,
                                                                     bool* was_cached) {
  const std::string name = variant.name();
  std::promise<std::shared_ptr<const detail::CompiledKernel>> promise;
  std::shared_future<std::shared_ptr<const detail::CompiledKernel>> future;
  bool owner = false;
  {
    std::lock_guard lock(mutex);
    auto it = compiled.find(name);
    if (it != compiled.end()) {
      future = it->second;
    } else {
      future = promise.get_future().share();
      compiled.emplace(name, future);
      owner = true;
    }
  }
  if (!owner) {
    if (was_cached) *was_cached = true;
    return future.get();
  }
  try {
    detail::check_variant(variant);
    const std::string key = key_for(variant);
    auto kernel = std::make_shared<detail::CompiledKernel>();
    if (auto loaded = disk.load(variant, key)) {
      *kernel = std::move(*loaded);
      if (was_cached) *was_cached = true;
    } else {
      const auto unit = [&] {
        std::lock_guard lock(mutex);
        return units.at(std::string(detail::family_traits(variant.family).source_file));
      }();
      *kernel = detail::compile_with_nvrtc(variant, unit);
      kernel->key = key;
      kernel->store_error = disk.store(*kernel);
      if (was_cached) *was_cached = false;
    }
    promise.set_value(kernel);
    return kernel;
  } catch (...) {
    // A failure is not remembered: the next request tries again (e.g. after a source fix).
    promise.set_exception(std::current_exception());
    std::lock_guard lock(mutex);
    compiled.erase(name);
    throw;
  }
}

KernelCache::KernelCache(CacheOptions options) : impl_(std::make_unique<Impl>(options.dir)) {}
KernelCache::~KernelCache() = default;

std::optional<std::filesystem::path> KernelCache::directory() const {
  if (!impl_->disk.persistent()) return std::nullopt;
  return impl_->disk.directory();
}

CompileOutcome KernelCache::compile(const Variant& variant) {
  CompileOutcome outcome;
  outcome.variant = variant;
  const auto start = std::chrono::steady_clock::now();
  try {
    auto kernel = impl_->get(variant, &outcome.was_cached);
    outcome.ok = kernel->store_error.empty();
    outcome.error = kernel->store_error.empty()
                        ? ""
                        : fmt::format("compiled, but not cached: {}", kernel->store_error);
    CacheEntry entry;
    entry.variant = variant;
    entry.key = kernel->key.substr(0, 16);
    entry.cubin_bytes = kernel->cubin.size();
    entry.registers = kernel->registers;
    entry.spill_bytes = kernel->spill_bytes;
    entry.static_shared_bytes = kernel->static_shared_bytes;
    entry.dynamic_shared_bytes = kernel->dynamic_shared_bytes;
    entry.compile_ms = kernel->compile_ms;
    entry.nvrtc_version = nvrtc_version();
    entry.flashjit_version = std::string(version());
    entry.created = kernel->created;
    if (impl_->disk.persistent())
      entry.cubin_path = impl_->disk.directory() /
                         fmt::format("{}.{}.cubin", variant.name(), entry.key);
    outcome.entry = std::move(entry);
  } catch (const std::exception& e) {
    outcome.ok = false;
    outcome.error = e.what();
  }
  outcome.milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

std::vector<CompileOutcome> KernelCache::precompile(
    const std::vector<Variant>& variants, int jobs,
    const std::function<void(const CompileOutcome&)>& on_done) {
  std::vector<CompileOutcome> outcomes(variants.size());
  if (jobs <= 0) jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  jobs = std::min<int>(jobs, static_cast<int>(std::max<size_t>(1, variants.size())));
  std::atomic<size_t> next{0};
  std::mutex report;
  auto worker = [&] {
    for (size_t i = next++; i < variants.size(); i = next++) {
      outcomes[i] = compile(variants[i]);
      if (on_done) {
        std::lock_guard lock(report);
        on_done(outcomes[i]);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < jobs; ++t) threads.emplace_back(worker);
  worker();
  for (auto& thread : threads) thread.join();
  return outcomes;
}

std::vector<CacheEntry> KernelCache::list(std::optional<std::string> arch) const {
  std::vector<CacheEntry> entries = impl_->disk.list(arch);
  for (CacheEntry& entry : entries) {
    try {
      entry.current = impl_->key_for(entry.variant).substr(0, 16) == entry.key;
    } catch (const Error&) {
      entry.current = false;  // its family or sources are not in this build
    }
  }
  return entries;
}

std::size_t KernelCache::remove_stale() {
  std::vector<CacheEntry> stale = list();
  std::erase_if(stale, [](const CacheEntry& entry) { return entry.current; });
  return impl_->disk.remove(stale);
}

std::size_t KernelCache::clear(std::optional<std::string> arch) {
  return impl_->disk.remove(impl_->disk.list(arch));
}

std::size_t KernelCache::prune(std::uint64_t max_bytes) { return impl_->disk.prune(max_bytes); }

}  // namespace flashjit
