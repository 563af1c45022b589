// Units, descriptions, dimension scales and typed configuration attributes of the statistics file
// (io/stats_schema.hpp). The tables below are the single list of every dataset the writer makes,
// its unit, its one line of meaning and its axes; docs/hdf5-schema.md shows the same.
#include "io/stats_schema.hpp"

#include <hdf5_hl.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "io/hdf5_check.hpp"

namespace moe {
namespace {

struct DatasetInfo {
  const char* path;
  const char* units;
  const char* description;
  std::array<const char*, 4> axes;  // labels of its dimensions, in order; nullptr past the last
};

// Every dataset of the file. "1" is the unit of a dimensionless number.
constexpr DatasetInfo kDatasets[] = {
    {"/steps/step", "step", "step index, 0-based; -1 = row not (yet) written", {}},
    {"/steps/loss", "nats/token", "LM cross-entropy, mean over the step's tokens", {"step"}},
    {"/steps/balance_loss", "1", "balance loss added to the loss, summed over layers", {"step"}},
    {"/steps/z_loss", "1", "router z-loss added to the loss, summed over layers", {"step"}},
    {"/steps/grad_norm", "1", "global gradient L2 norm", {"step"}},
    {"/steps/lr", "1", "learning rate used by the step", {"step"}},
    {"/steps/tokens_per_s", "tokens/s", "global throughput of the step", {"step"}},
    {"/steps/step_time_s", "s", "wall time of the step", {"step"}},
    {"/routing/expert_load",
     "assignments",
     "(token, slot) assignments to each expert",
     {"step", "layer", "expert"}},
    {"/routing/rank_load",
     "assignments",
     "assignments received by each rank",
     {"step", "layer", "rank"}},
    {"/routing/bias",
     "1",
     "routing bias used for the step's selection",
     {"step", "layer", "expert"}},
    {"/routing/load_variance",
     "assignments^2",
     "population variance of the expert load",
     {"step", "layer"}},
    {"/routing/max_violation", "1", "(max - mean) / mean of the expert load", {"step", "layer"}},
    {"/routing/load_cv", "1", "std / mean of the expert load", {"step", "layer"}},
    {"/routing/rank_overload", "1", "max / mean of the rank load", {"step", "layer"}},
    {"/routing/balance_loss", "1", "balance loss of the layer", {"step", "layer"}},
    {"/routing/z_loss",
     "1",
     "router z-loss of the layer: its weight times the mean squared log-sum-exp of the logits",
     {"step", "layer"}},
    {"/routing/dropped",
     "assignments",
     "(token, slot) assignments to each expert dropped by the token capacity (counted in "
     "expert_load; 0 without --capacity-factor)",
     {"step", "layer", "expert"}},
    {"/routing/source_expert_load",
     "assignments",
     "(token, slot) assignments each rank's tokens sent to each expert (dispatched: not those "
     "the token capacity dropped)",
     {"step", "layer", "rank", "expert"}},
    {"/routing/dispatch_rows",
     "assignments",
     "(token, slot) assignments dispatched to the experts' owners, over all ranks",
     {"step", "layer"}},
    {"/routing/cross_host_rows",
     "assignments",
     "assignments dispatched from a rank on one host to an expert owner on another",
     {"step", "layer"}},
    {"/routing/cross_host_tokens",
     "tokens",
     "tokens sent across hosts when each goes once to each other host holding one of its experts",
     {"step", "layer"}},
    {"/perf/phase_time", "s", "wall time each rank spent in each phase", {"step", "rank", "phase"}},
    {"/perf/phases", "1", "phase names, the last axis of /perf/phase_time", {}},
    {"/layers/routing", "1", "routing of each layer: hash, topk or forced", {"layer"}},
    {"/layers/hash_table",
     "expert id",
     "experts of each token id in each hash layer",
     {"hash_layer", "token_id", "slot"}},
    {"/layers/placement",
     "1",
     "1 where EP rank q holds expert e in layer l, in every EP group and every step of the file",
     {"layer", "ep_rank", "expert"}},
    {"/hosts/rank_host",
     "host",
     "host of each rank, hosts numbered by their lowest rank",
     {"rank"}},
    {"/dims/layer", "layer", "layer index, the layer axis", {}},
    {"/dims/expert", "expert", "routed expert index, the expert axis", {}},
    {"/dims/rank", "rank", "MPI rank, the rank axis", {}},
    {"/dims/slot", "slot", "position among a token's K chosen experts, the slot axis", {}},
    {"/dims/token", "token", "traced token index r*B*S + b*S + s, the token axis", {}},
    {"/trace/step", "step", "step index of the traced row; -1 = row not (yet) written", {}},
    {"/trace/token_id", "token id", "token id of each traced token", {"traced_step", "token"}},
    {"/trace/position",
     "tokens",
     "position of the token in its sequence",
     {"traced_step", "token"}},
    {"/trace/rank", "rank", "rank that held the token", {"traced_step", "token"}},
    {"/trace/experts",
     "expert id",
     "experts chosen for each token",
     {"traced_step", "layer", "token", "slot"}},
    {"/trace/weights",
     "1",
     "combine weights of the chosen experts",
     {"traced_step", "layer", "token", "slot"}},
    {"/trace/experts_unbiased",
     "expert id",
     "experts the scores without the routing bias would choose (the chosen ones where no bias "
     "applies: hash and forced layers)",
     {"traced_step", "layer", "token", "slot"}},
    {"/eval/step",
     "step",
     "training step the validation loss followed; -1 = row not (yet) written",
     {}},
    {"/eval/loss",
     "nats/token",
     "LM cross-entropy, mean over the validation tokens",
     {"eval_step"}},
    {"/eval/time_s", "s", "wall time of the evaluation", {"eval_step"}},
    {"/eval/tokens", "tokens", "validation tokens evaluated", {"eval_step"}},
    {"/eval/expert_load",
     "assignments",
     "(token, slot) assignments to each expert, all "
     "validation tokens",
     {"eval_step", "layer", "expert"}},
    {"/eval/load_variance",
     "assignments^2",
     "population variance of the validation expert load",
     {"eval_step", "layer"}},
    {"/eval/max_violation",
     "1",
     "(max - mean) / mean of the validation expert load",
     {"eval_step", "layer"}},
    {"/eval/dropped",
     "assignments",
     "validation assignments to each expert dropped by the token capacity (counted in "
     "expert_load)",
     {"eval_step", "layer", "expert"}},
};

// The datasets of each shadow balancer's group /shadow/<rule> (the group's name is its rule).
constexpr DatasetInfo kShadowDatasets[] = {
    {"expert_load",
     "assignments",
     "(token, slot) assignments to each expert had this shadow balancer's bias routed the step "
     "(0 outside top-k layers)",
     {"step", "layer", "expert"}},
    {"max_violation",
     "1",
     "(max - mean) / mean of this shadow balancer's expert load (0 outside top-k layers)",
     {"step", "layer"}},
    {"bias",
     "1",
     "this shadow balancer's bias, as the step's routing used it",
     {"step", "layer", "expert"}},
};

// Axis label -> the dataset that is its dimension scale (labels without one: none).
struct ScaleInfo {
  const char* name;
  const char* path;
};
constexpr ScaleInfo kScales[] = {
    {"step", "/steps/step"},  {"layer", "/dims/layer"},       {"expert", "/dims/expert"},
    {"rank", "/dims/rank"},   {"phase", "/perf/phases"},      {"slot", "/dims/slot"},
    {"token", "/dims/token"}, {"traced_step", "/trace/step"}, {"eval_step", "/eval/step"},
};

const char* scale_path(const char* axis) {
  for (const ScaleInfo& s : kScales) {
    if (std::string(s.name) == axis) return s.path;
  }
  return nullptr;
}

bool exists(hid_t file, const char* path) {
  // Only groups that exist can be asked about (H5Lexists fails on a missing parent).
  const std::string p(path);
  const std::string group = p.substr(0, p.find('/', 1));
  return MOE_H5_CHECK(H5Lexists(file, group.c_str(), H5P_DEFAULT)) > 0 &&
         MOE_H5_CHECK(H5Lexists(file, path, H5P_DEFAULT)) > 0;
}

H5Id open_dataset(hid_t file, const char* path) {
  return H5Id(MOE_H5_CHECK(H5Dopen2(file, path, H5P_DEFAULT)), H5Dclose);
}

void index_dataset(hid_t group, const char* name, hsize_t n) {
  std::vector<int32_t> index(n);
  std::iota(index.begin(), index.end(), 0);
  h5_write_fixed_dataset(group, name, H5T_STD_I32LE, H5T_NATIVE_INT32, {n}, index.data());
}

void delete_attribute_if_present(hid_t obj, const char* name) {
  if (MOE_H5_CHECK(H5Aexists(obj, name)) > 0) MOE_H5_CHECK(H5Adelete(obj, name));
}

// A dataset of the file with its description: a row of kDatasets, or of kShadowDatasets under
// one shadow balancer's group.
struct FileDataset {
  std::string path;
  const DatasetInfo* info;
};

// The names of /shadow's groups, in the order of their names (HDF5's index).
std::vector<std::string> shadow_groups(hid_t file) {
  std::vector<std::string> names;
  if (MOE_H5_CHECK(H5Lexists(file, "/shadow", H5P_DEFAULT)) <= 0) return names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    return 0;
  };
  MOE_H5_CHECK(H5Literate_by_name(file, "/shadow", H5_INDEX_NAME, H5_ITER_INC, nullptr, collect,
                                  &names, H5P_DEFAULT));
  return names;
}

// Every described dataset the file holds: the table's, then each shadow balancer's, in the same
// order in every file, so that the file stays a pure function of what was written.
std::vector<FileDataset> file_datasets(hid_t file) {
  std::vector<FileDataset> found;
  for (const DatasetInfo& d : kDatasets) {
    if (exists(file, d.path)) found.push_back({d.path, &d});
  }
  for (const std::string& group : shadow_groups(file)) {
    for (const DatasetInfo& d : kShadowDatasets) {
      const std::string path = "/shadow/" + group + "/" + d.path;
      if (MOE_H5_CHECK(H5Lexists(file, path.c_str(), H5P_DEFAULT)) > 0) found.push_back({path, &d});
    }
  }
  return found;
}

// Attaches the scale of each labelled axis of every dataset present (file_datasets' order).
void attach_scales(hid_t file) {
  for (const FileDataset& f : file_datasets(file)) {
    const DatasetInfo& d = *f.info;
    const H5Id dset = open_dataset(file, f.path.c_str());
    for (unsigned axis = 0; axis < d.axes.size() && d.axes[axis] != nullptr; ++axis) {
      const char* scale = scale_path(d.axes[axis]);
      if (scale == nullptr || !exists(file, scale)) continue;
      const H5Id s = open_dataset(file, scale);
      MOE_H5_CHECK(H5DSattach_scale(dset.get(), s.get(), axis));
    }
  }
}

// "true"/"false", a whole number, a finite number, or none of these.
enum class ValueKind { kBool, kInt, kFloat, kString };

ValueKind value_kind(const std::string& v, int64_t& as_int, double& as_double) {
  if (v == "true" || v == "false") return ValueKind::kBool;
  if (v.empty()) return ValueKind::kString;
  const char* begin = v.c_str();
  char* end = nullptr;
  errno = 0;
  as_int = std::strtoll(begin, &end, 10);
  if (errno == 0 && end == begin + v.size()) return ValueKind::kInt;
  errno = 0;
  as_double = std::strtod(begin, &end);
  if (errno == 0 && end == begin + v.size() && std::isfinite(as_double)) return ValueKind::kFloat;
  return ValueKind::kString;
}

std::string trimmed(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

}  // namespace

void stats_describe(hid_t file, const StatsAxes& axes) {
  const H5Id gcpl = h5_untimed_plist(H5P_GROUP_CREATE);
  const H5Id dims(MOE_H5_CHECK(H5Gcreate2(file, "/dims", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT)),
                  H5Gclose);
  index_dataset(dims.get(), "layer", axes.L);
  index_dataset(dims.get(), "expert", axes.E);
  index_dataset(dims.get(), "rank", axes.W);
  index_dataset(dims.get(), "slot", axes.K);
  if (axes.T > 0) index_dataset(dims.get(), "token", axes.T);

  for (const ScaleInfo& s : kScales) {
    if (!exists(file, s.path)) continue;
    MOE_H5_CHECK(H5DSset_scale(open_dataset(file, s.path).get(), s.name));
  }
  for (const FileDataset& f : file_datasets(file)) {
    const DatasetInfo& d = *f.info;
    const H5Id dset = open_dataset(file, f.path.c_str());
    h5_write_string_attr(dset.get(), "units", d.units);
    h5_write_string_attr(dset.get(), "description", d.description);
    for (unsigned axis = 0; axis < d.axes.size() && d.axes[axis] != nullptr; ++axis) {
      MOE_H5_CHECK(H5DSset_label(dset.get(), axis, d.axes[axis]));
    }
  }
  attach_scales(file);
}

void stats_reattach_scales(hid_t file) {
  for (const FileDataset& f : file_datasets(file)) {
    const H5Id dset = open_dataset(file, f.path.c_str());
    delete_attribute_if_present(dset.get(), "DIMENSION_LIST");
    delete_attribute_if_present(dset.get(), "REFERENCE_LIST");
  }
  attach_scales(file);
}

void stats_write_config_attributes(hid_t file, const std::vector<StatsConfigValue>& values,
                                   const std::string& config_text) {
  std::vector<StatsConfigValue> typed = values;
  if (typed.empty()) {
    std::istringstream lines(config_text);
    std::string line;
    while (std::getline(lines, line)) {
      line = trimmed(line);
      const size_t eq = line.find('=');
      if (line.empty() || line[0] == '#' || eq == std::string::npos) continue;
      StatsConfigValue v{trimmed(line.substr(0, eq)), trimmed(line.substr(eq + 1)), 's'};
      if (v.text.size() >= 2 && v.text.front() == '"' && v.text.back() == '"') {
        v.text = v.text.substr(1, v.text.size() - 2);  // a TOML string, kept as written inside
        typed.push_back(std::move(v));
        continue;
      }
      int64_t as_int = 0;
      double as_double = 0;
      switch (value_kind(v.text, as_int, as_double)) {
        case ValueKind::kBool:
          v.kind = 'b';
          break;
        case ValueKind::kInt:
          v.kind = 'i';
          break;
        case ValueKind::kFloat:
          v.kind = 'f';
          break;
        case ValueKind::kString:
          break;
      }
      typed.push_back(std::move(v));
    }
  }
  const H5Id gcpl = h5_untimed_plist(H5P_GROUP_CREATE);
  const H5Id group(MOE_H5_CHECK(H5Gcreate2(file, "/config", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT)),
                   H5Gclose);
  // h5py's boolean: an enum of int8 with FALSE = 0 and TRUE = 1.
  const H5Id bool_type(MOE_H5_CHECK(H5Tenum_create(H5T_STD_I8LE)), H5Tclose);
  const int8_t no = 0, yes = 1;
  MOE_H5_CHECK(H5Tenum_insert(bool_type.get(), "FALSE", &no));
  MOE_H5_CHECK(H5Tenum_insert(bool_type.get(), "TRUE", &yes));
  for (const StatsConfigValue& v : typed) {
    const char* key = v.name.c_str();
    if (v.name.empty() || MOE_H5_CHECK(H5Aexists(group.get(), key)) > 0) continue;
    // A value that does not read as its kind is kept as text rather than lost.
    const char* begin = v.text.c_str();
    char* end = nullptr;
    errno = 0;
    bool written = false;
    if (v.kind == 'b' && (v.text == "true" || v.text == "false")) {
      const int8_t b = v.text == "true" ? yes : no;
      h5_write_attr(group.get(), key, bool_type.get(), bool_type.get(), &b);
      written = true;
    } else if (v.kind == 'i') {
      const int64_t x = std::strtoll(begin, &end, 10);
      if ((written = errno == 0 && end == begin + v.text.size() && !v.text.empty())) {
        h5_write_attr(group.get(), key, H5T_STD_I64LE, H5T_NATIVE_INT64, &x);
      }
    } else if (v.kind == 'u') {
      const uint64_t x = std::strtoull(begin, &end, 10);
      if ((written =
               errno == 0 && end == begin + v.text.size() && !v.text.empty() && v.text[0] != '-')) {
        h5_write_attr(group.get(), key, H5T_STD_U64LE, H5T_NATIVE_UINT64, &x);
      }
    } else if (v.kind == 'f') {
      const double x = std::strtod(begin, &end);
      if ((written = errno == 0 && end == begin + v.text.size() && !v.text.empty())) {
        h5_write_attr(group.get(), key, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &x);
      }
    }
    if (!written) h5_write_string_attr(group.get(), key, v.text);
  }
}

}  // namespace moe
