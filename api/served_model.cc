#include "api/served_model.h"

#include <filesystem>

#include "absl/time/clock.h"
#include "common/formats/model_fingerprint.h"

namespace loom::api {

loom::v1::ServedModel ServedModel::ToProto() const {
  loom::v1::ServedModel model;
  model.set_id(id);
  *model.mutable_info() = info;
  model.set_created(created);
  return model;
}

ServedModel MakeServedModel(const std::string& path, const common::GgufFile& gguf,
                            const common::ModelConfig& config, const std::string& name_override) {
  ServedModel model;
  std::filesystem::path file(path);
  // A Hugging Face directory given as "dir/" is named for the directory.
  if (file.filename().empty()) file = file.parent_path();
  model.id = !name_override.empty()                ? name_override
             : file.extension() == ".gguf"         ? file.stem().string()
                                                   : file.filename().string();
  model.info.set_name(config.name);
  model.info.set_path(path);
  model.info.set_architecture(config.architecture);
  model.info.set_vocab_size(config.vocab_size);
  model.info.set_context_length(config.context_length);
  model.info.set_fingerprint(common::ModelFingerprint(gguf));
  model.created = absl::ToUnixSeconds(absl::Now());
  return model;
}

}  // namespace loom::api
