#include "jit/kernel_store.hpp"

#include "jit/content_key.hpp"
#include "jit/nvrtc.hpp"
#include "jit/user_source.hpp"

namespace flashjit::detail {

std::vector<SourceFile> KernelStore::translation_unit(const std::string& source_file) {
  std::lock_guard lock(units_mutex_);
  auto it = units_.find(source_file);
  if (it == units_.end())
    it = units_.emplace(source_file, kernel_translation_unit(source_file)).first;
  return it->second;
}

std::string KernelStore::key_for(const Variant& variant, const KernelSpec& spec) {
  std::vector<SourceFile> sources = translation_unit(spec.source_file);
  if (!variant.user_functions.empty()) sources.push_back(user_functions_template());
  return content_key({std::string(version()), nvrtc_version(), variant.name(), spec.name_expression,
                      spec.block_mask_name_expression, spec.options, std::move(sources)});
}

std::shared_ptr<const CompiledKernel> KernelStore::get_if_built(const Variant& variant,
                                                                const KernelSpec& spec) {
  if (auto made = compiled_.find_made(variant.name())) return *made;
  auto loaded = disk_.load(variant, key_for(variant, spec));
  if (!loaded) return nullptr;
  auto kernel = std::make_shared<const CompiledKernel>(std::move(*loaded));
  // Shared with every later get(): the one record of this variant in the process.
  return compiled_.get(variant.name(), [&] { return kernel; });
}

std::shared_ptr<const CompiledKernel> KernelStore::get(const Variant& variant,
                                                       const KernelSpec& spec, bool* was_cached) {
  bool from_disk = false;
  bool made_here = false;
  auto kernel = compiled_.get(
      variant.name(),
      [&]() -> std::shared_ptr<const CompiledKernel> {
        const std::string key = key_for(variant, spec);
        if (auto loaded = disk_.load(variant, key)) {
          from_disk = true;
          return std::make_shared<const CompiledKernel>(std::move(*loaded));
        }
        KernelSpec compiled_spec = spec;
        if (!has_mask_mod(variant)) compiled_spec.block_mask_name_expression.clear();
        auto compiled = std::make_shared<CompiledKernel>(compile_with_nvrtc(
            variant, compiled_spec,
            with_user_functions(translation_unit(spec.source_file), variant)));
        compiled->key = key;
        compiled->entry.key = key.substr(0, 16);
        compiled->store_error = disk_.store(*compiled);
        if (disk_.persistent()) compiled->entry.cubin_path = disk_.cubin_path(variant, key);
        return compiled;
      },
      &made_here);
  if (was_cached) *was_cached = !made_here || from_disk;
  return kernel;
}

}  // namespace flashjit::detail
