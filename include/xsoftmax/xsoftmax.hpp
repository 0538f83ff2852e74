// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Umbrella header: every host-usable public header of xsoftmax. CUDA code additionally includes
/// `<xsoftmax/cuda.cuh>` (nvcc only).

#include <xsoftmax/backend.hpp>
#include <xsoftmax/config.hpp>
#include <xsoftmax/error.hpp>
#include <xsoftmax/full_softmax.hpp>
#include <xsoftmax/hierarchical_softmax.hpp>
#include <xsoftmax/precision.hpp>
#include <xsoftmax/tree/kmeans_tree.hpp>
#include <xsoftmax/tree/parent_array.hpp>
#include <xsoftmax/tree/runtime_tree.hpp>
#include <xsoftmax/tree/tree_types.hpp>
#include <xsoftmax/tree/uniform_tree.hpp>
#include <xsoftmax/types.hpp>
#include <xsoftmax/selective_softmax.hpp>
#include <xsoftmax/knn_softmax.hpp>
#include <xsoftmax/selection/selection_types.hpp>
#include <xsoftmax/selection/explicit_candidates.hpp>
#include <xsoftmax/selection/sampled_negatives.hpp>
#include <xsoftmax/selection/ivf_index.hpp>
#include <xsoftmax/selection/knn_graph.hpp>
#include <xsoftmax/selection/knn_selector.hpp>
#include <xsoftmax/selection/feature_query.hpp>
#include <xsoftmax/io/checkpoint.hpp>
#include <xsoftmax/sharding/sharded_hierarchical_softmax.hpp>
