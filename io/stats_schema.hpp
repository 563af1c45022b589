// The self-description of the statistics file (format version 2, docs/hdf5-schema.md): units and a
// one-line description as attributes on every dataset, named axes (HDF5 dimension scales and
// dimension labels) so that h5py and xarray users see step, layer, expert, rank and phase axes,
// and the configuration as typed attributes of the group /config beside its text.
//
// Everything here creates attributes or datasets, so it runs before SWMR write mode starts. The
// scales of the per-step datasets' first axis is /steps/step itself: it grows with the rows, so the
// axis and its scale always have the same length once a row is complete.
// Legend: L layers, E experts, W ranks, K top-k, T traced tokens per traced step.
#pragma once

#include <hdf5.h>

#include <string>
#include <vector>

#include "io/stats_types.hpp"

namespace moe {

struct StatsAxes {
  hsize_t L = 0, E = 0, W = 0, K = 0;
  hsize_t T = 0;  // 0: the file has no /trace group
};

// Creates /dims/{layer,expert,rank,slot} (and /dims/token with traces), the index 0..n-1 of
// each axis; makes them, /steps/step, /perf/phases and /trace/step dimension scales; labels every
// dataset's axes and attaches the scales; writes "units" and "description" on every dataset.
// The per-step and trace datasets must exist already.
void stats_describe(hid_t file, const StatsAxes& axes);

// Re-attaches every dimension scale in a copy of the file. H5Ocopy copies the attributes that
// hold the scales' object references (DIMENSION_LIST, REFERENCE_LIST) but not the references'
// targets across the separate copies of each group, so they point nowhere in the copy: they are
// deleted and made again. Labels, units and descriptions copy as they are.
void stats_reattach_scales(hid_t file);

// The group /config: one attribute per option, of its type (StatsConfigValue::kind): a bool an
// 8-bit enum FALSE/TRUE (h5py reads numpy.bool_), int64, uint64, float64 or a string. Without
// `values`, one per `key = value` line of `config_text` (comments and [table] lines skipped),
// typed by the value's form: a value in double quotes a string (its escapes kept as written),
// "true"/"false" a bool, a whole number int64, another finite number float64, else a string.
void stats_write_config_attributes(hid_t file, const std::vector<StatsConfigValue>& values,
                                   const std::string& config_text);

}  // namespace moe
