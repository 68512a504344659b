#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "api/kernel_cache_impl.hpp"
#include "families/registry.hpp"

namespace flashjit {

std::shared_ptr<const detail::CompiledKernel> KernelCache::Impl::get(const Variant& variant,
                                                                     bool* was_cached) {
  detail::check_variant(variant);
  return store.get(variant, detail::kernel_spec(variant), was_cached);
}

std::shared_ptr<const detail::CompiledKernel> KernelCache::Impl::get_if_built(
    const Variant& variant) {
  detail::check_variant(variant);
  return store.get_if_built(variant, detail::kernel_spec(variant));
}

std::string_view to_string(EntryState state) {
  switch (state) {
    case EntryState::current: return "current";
    case EntryState::stale: return "stale";
    case EntryState::unknown: return "unknown";
  }
  return "unknown";
}

KernelCache::KernelCache(CacheOptions options) : impl_(std::make_unique<Impl>(options)) {}
KernelCache::~KernelCache() = default;

std::optional<std::filesystem::path> KernelCache::directory() const {
  if (!impl_->store.disk().persistent()) return std::nullopt;
  return impl_->store.disk().directory();
}

std::string KernelCache::why_not_persistent() const {
  return impl_->store.disk().why_not_persistent();
}

std::vector<CacheLayer> KernelCache::layers() const {
  std::vector<CacheLayer> layers;
  for (const auto& layer : impl_->store.disk().layers())
    layers.push_back({layer.dir, layer.writable});
  return layers;
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
    outcome.entry = kernel->entry;
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
  std::vector<CacheEntry> entries = impl_->store.disk().list(arch);
  for (CacheEntry& entry : entries) {
    try {
      detail::check_variant(entry.variant);
    } catch (const Error&) {
      entry.state = EntryState::stale;  // a family or variant this build does not have
      continue;
    }
    try {
      const detail::KernelSpec spec = detail::kernel_spec(entry.variant);
      entry.state = impl_->store.key_for(entry.variant, spec).substr(0, 16) == entry.key
                        ? EntryState::current
                        : EntryState::stale;
    } catch (const Error&) {
      entry.state = EntryState::unknown;  // its sources cannot be read: judge nothing
    }
  }
  return entries;
}

std::size_t KernelCache::remove_stale() {
  std::vector<CacheEntry> stale = list();
  std::erase_if(stale, [](const CacheEntry& entry) {
    return entry.state != EntryState::stale || entry.read_only;
  });
  return impl_->store.disk().remove(stale);
}

std::size_t KernelCache::clear(std::optional<std::string> arch) {
  return impl_->store.disk().remove(impl_->store.disk().list(arch));
}

std::size_t KernelCache::prune(std::uint64_t max_bytes) {
  return impl_->store.disk().prune(max_bytes);
}

}  // namespace flashjit
