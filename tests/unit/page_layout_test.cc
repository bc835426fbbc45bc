// PageLayout (SPEC §4): validation, offsets and entry round trips over odd
// geometries, linear and tiled.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/format/page_layout.h"

namespace indexer {
namespace {

using ::testing::HasSubstr;

struct Geometry {
  KvFormat format;
  int32_t head_dim;
  int32_t page_entries;
  int32_t n_per_tile;
  int32_t d_per_tile;
  int32_t scale_lanes;
};

std::string Name(const testing::TestParamInfo<Geometry>& info) {
  const Geometry& g = info.param;
  return std::string(KvFormatName(g.format)) + "_D" +
         std::to_string(g.head_dim) + "_E" + std::to_string(g.page_entries) +
         (g.n_per_tile ? "_n" + std::to_string(g.n_per_tile) + "_d" +
                             std::to_string(g.d_per_tile) + "_l" +
                             std::to_string(g.scale_lanes)
                       : "_linear");
}

class PageLayoutGeometryTest : public testing::TestWithParam<Geometry> {
 protected:
  PageLayout MakeLayout() {
    const Geometry& g = GetParam();
    auto l = PageLayout::Make(g.format, g.head_dim, g.page_entries,
                              g.n_per_tile, g.d_per_tile, g.scale_lanes);
    EXPECT_TRUE(l.ok()) << l.status();
    return *l;
  }
};

TEST_P(PageLayoutGeometryTest, OffsetsAreABijectionOntoThePage) {
  const PageLayout l = MakeLayout();
  const int32_t vb = l.value_bytes(), sb = l.scale_bytes();
  EXPECT_EQ(l.entry_bytes(), vb + sb);
  EXPECT_EQ(l.page_bytes(), int64_t{l.page_entries} * (vb + sb));
  std::vector<int> hits(static_cast<size_t>(l.page_bytes()), 0);
  for (int32_t e = 0; e < l.page_entries; ++e) {
    for (int32_t b = 0; b < vb; ++b) {
      const int64_t off = l.ValueOffset(e, b);
      ASSERT_GE(off, 0);
      ASSERT_LT(off, l.scale_region());
      ++hits[off];
    }
    for (int32_t s = 0; s < sb; ++s) {
      const int64_t off = l.ScaleOffset(e, s);
      ASSERT_GE(off, l.scale_region());
      ASSERT_LT(off, l.page_bytes());
      ++hits[off];
    }
  }
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << i;
}

TEST_P(PageLayoutGeometryTest, StoreLoadRoundTrips) {
  const PageLayout l = MakeLayout();
  const int32_t eb = l.entry_bytes();
  std::mt19937 rng(l.page_entries * 131 + l.head_dim);
  std::vector<uint8_t> entries(static_cast<size_t>(l.page_entries) * eb);
  for (uint8_t& b : entries) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> page(static_cast<size_t>(l.page_bytes()), 0);
  // Store in a scrambled order: entries are independent.
  std::vector<int32_t> order(l.page_entries);
  for (int32_t i = 0; i < l.page_entries; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  for (int32_t e : order) StoreEntry(l, entries.data() + int64_t{e} * eb, e,
                                     page.data());
  std::vector<uint8_t> back(eb);
  for (int32_t e = 0; e < l.page_entries; ++e) {
    LoadEntry(l, page.data(), e, back.data());
    ASSERT_EQ(0, std::memcmp(back.data(), entries.data() + int64_t{e} * eb,
                             eb))
        << "entry " << e;
    // Each byte sits where the offset functions say.
    for (int32_t b = 0; b < l.value_bytes(); ++b) {
      ASSERT_EQ(page[l.ValueOffset(e, b)], back[b]);
    }
    for (int32_t s = 0; s < l.scale_bytes(); ++s) {
      ASSERT_EQ(page[l.ScaleOffset(e, s)], back[l.value_bytes() + s]);
    }
  }
}

TEST_P(PageLayoutGeometryTest, LinearFormMatchesSpec) {
  const PageLayout l = MakeLayout();
  if (l.tiled()) {
    // Tiled: within a run, chunk c of entry i follows chunk c of entry i-1.
    if (l.n_per_tile > 1 && l.d_per_tile < l.value_bytes()) {
      EXPECT_EQ(l.ValueOffset(1, 0), l.d_per_tile);
      EXPECT_EQ(l.ValueOffset(0, l.d_per_tile),
                int64_t{l.n_per_tile} * l.d_per_tile);
    }
    return;
  }
  for (int32_t e = 0; e < l.page_entries; ++e) {
    EXPECT_EQ(l.ValueOffset(e, 0), int64_t{e} * l.value_bytes());
    EXPECT_EQ(l.ScaleOffset(e, 0),
              l.scale_region() + int64_t{e} * l.scale_bytes());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, PageLayoutGeometryTest,
    testing::Values(
        Geometry{KvFormat::kFp8, 128, 1, 0, 0, 1},
        Geometry{KvFormat::kFp8, 128, 3, 0, 0, 1},
        Geometry{KvFormat::kFp8, 128, 16, 0, 0, 1},
        Geometry{KvFormat::kFp8, 128, 64, 0, 0, 1},
        Geometry{KvFormat::kFp8, 32, 3, 3, 8, 1},
        Geometry{KvFormat::kFp8, 128, 64, 16, 16, 1},
        Geometry{KvFormat::kFp8, 96, 16, 4, 32, 1},
        Geometry{KvFormat::kFp8, 64, 1, 1, 64, 1},
        Geometry{KvFormat::kMxfp4, 128, 1, 0, 0, 1},
        Geometry{KvFormat::kMxfp4, 128, 3, 0, 0, 1},
        Geometry{KvFormat::kMxfp4, 128, 16, 0, 0, 1},
        Geometry{KvFormat::kMxfp4, 128, 64, 0, 0, 1},
        Geometry{KvFormat::kMxfp4, 128, 64, 16, 16, 4},
        Geometry{KvFormat::kMxfp4, 128, 64, 4, 16, 2},
        Geometry{KvFormat::kMxfp4, 128, 16, 16, 64, 1},
        Geometry{KvFormat::kMxfp4, 96, 3, 1, 8, 3},
        Geometry{KvFormat::kMxfp4, 192, 3, 3, 12, 2},
        Geometry{KvFormat::kMxfp4, 32, 1, 1, 16, 1}),
    Name);

TEST(PageLayoutTest, VllmByteCounts) {
  auto fp8 = PageLayout::Make(KvFormat::kFp8, 128, 64);
  ASSERT_TRUE(fp8.ok());
  EXPECT_EQ(fp8->entry_bytes(), 132);
  EXPECT_EQ(fp8->page_bytes(), 8192 + 256);
  auto mx = PageLayout::Make(KvFormat::kMxfp4, 128, 64);
  ASSERT_TRUE(mx.ok());
  EXPECT_EQ(mx->entry_bytes(), 68);
}

void ExpectRejected(absl::StatusOr<PageLayout> l, const std::string& field,
                    const std::string& detail) {
  ASSERT_FALSE(l.ok()) << l->DebugString();
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(l.status().message()), HasSubstr(field + ":"));
  EXPECT_THAT(std::string(l.status().message()), HasSubstr(detail));
}

TEST(PageLayoutTest, RejectsInvalidGeometries) {
  ExpectRejected(PageLayout::Make(KvFormat::kFp8, 100, 64), "head_dim",
                 "got 100");
  ExpectRejected(PageLayout::Make(KvFormat::kFp8, 0, 64), "head_dim",
                 "multiple of 32");
  ExpectRejected(PageLayout::Make(KvFormat::kFp8, 128, 0), "page_entries",
                 "got 0");
  ExpectRejected(PageLayout::Make(KvFormat::kFp8, 128, 64, 24, 16),
                 "tiling.n_per_tile", "divisor of 64");
  ExpectRejected(PageLayout::Make(KvFormat::kMxfp4, 128, 64, 16, 24, 1),
                 "tiling.d_per_tile",
                 "expected a divisor of 64 (value bytes per entry), got 24");
  ExpectRejected(PageLayout::Make(KvFormat::kFp8, 128, 64, 16, 0),
                 "tiling.d_per_tile", "divisor of 128");
  ExpectRejected(PageLayout::Make(KvFormat::kMxfp4, 128, 64, 16, 16, 3),
                 "tiling.scale_lanes", "divisor of 4");
  ExpectRejected(PageLayout::Make(KvFormat::kFp8, 128, 64, 16, 16, 2),
                 "tiling.scale_lanes", "got 2");
  ExpectRejected(PageLayout::Make(KvFormat::kFp8, 128, 64, 0, 16),
                 "tiling.d_per_tile", "linear");
  ExpectRejected(PageLayout::Make(KvFormat::kFp8, 128, 64, -1, 16),
                 "tiling.n_per_tile", "got -1");
}

TEST(PageLayoutTest, ScaleLanesZeroReadsAsOne) {
  auto l = PageLayout::Make(KvFormat::kMxfp4, 128, 64, 16, 16, 0);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->scale_lanes, 1);
}

std::vector<uint8_t> HexBytes(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr,
                                                  16)));
  }
  return out;
}

// Whole tiled pages pinned bit for bit (tests/data/vectors/tiled_pages.txt,
// a copy of the shared vectors built from SPEC §4's words): each case's
// entries are stored with StoreEntry and the page must equal the file's. The
// geometry tests above only prove the offsets are a bijection, which a
// permuted but consistent order (say, MXFP4 scales lane-major) also is.
TEST(PageLayoutTest, TiledPagesMatchVectors) {
  const std::string path =
      std::string(INDEXER_VECTORS_DIR) + "/tiled_pages.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "cannot open " << path;
  int cases = 0, mxfp4_cases = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream head(line);
    std::string format_name, word;
    int32_t e = 0, d = 0, n_per_tile = 0, d_per_tile = 0, lanes = 0;
    ASSERT_TRUE(head >> format_name >> e >> d >> n_per_tile >> d_per_tile >>
                lanes)
        << line;
    ASSERT_TRUE(format_name == "fp8" || format_name == "mxfp4") << line;
    const KvFormat format =
        format_name == "fp8" ? KvFormat::kFp8 : KvFormat::kMxfp4;
    std::string entries_hex, page_hex;
    ASSERT_TRUE(std::getline(in, line));
    std::istringstream(line) >> word >> entries_hex;
    ASSERT_EQ(word, "entries");
    ASSERT_TRUE(std::getline(in, line));
    std::istringstream(line) >> word >> page_hex;
    ASSERT_EQ(word, "page");

    auto l = PageLayout::Make(format, d, e, n_per_tile, d_per_tile, lanes);
    ASSERT_TRUE(l.ok()) << l.status();
    ASSERT_TRUE(l->tiled());
    const std::vector<uint8_t> entries = HexBytes(entries_hex);
    const std::vector<uint8_t> want = HexBytes(page_hex);
    ASSERT_EQ(static_cast<int64_t>(entries.size()), l->page_bytes());
    ASSERT_EQ(static_cast<int64_t>(want.size()), l->page_bytes());

    std::vector<uint8_t> page(want.size(), 0);
    for (int32_t i = 0; i < e; ++i) {
      StoreEntry(*l, entries.data() + static_cast<size_t>(i) * l->entry_bytes(),
                 i, page.data());
    }
    const std::string name = l->DebugString();
    int64_t first_diff = -1, diffs = 0;
    for (size_t b = 0; b < page.size(); ++b) {
      if (page[b] != want[b]) {
        if (first_diff < 0) first_diff = static_cast<int64_t>(b);
        ++diffs;
      }
    }
    EXPECT_EQ(diffs, 0) << name << ": first difference at byte " << first_diff
                        << " of " << page.size() << " (scale region from "
                        << l->scale_region() << ")";

    // And back: every entry loads to its wire form.
    std::vector<uint8_t> entry(static_cast<size_t>(l->entry_bytes()));
    for (int32_t i = 0; i < e; ++i) {
      LoadEntry(*l, want.data(), i, entry.data());
      EXPECT_TRUE(std::equal(entry.begin(), entry.end(),
                             entries.begin() + static_cast<size_t>(i) *
                                                   l->entry_bytes()))
          << name << " entry " << i;
    }
    ++cases;
    if (format == KvFormat::kMxfp4 && lanes > 1) ++mxfp4_cases;
  }
  EXPECT_EQ(cases, 5);
  EXPECT_EQ(mxfp4_cases, 4);  // the scale order is only visible with lanes > 1
}

TEST(PageLayoutTest, DebugStringAndNames) {
  EXPECT_STREQ(KvFormatName(KvFormat::kFp8), "fp8");
  EXPECT_STREQ(KvFormatName(KvFormat::kMxfp4), "mxfp4");
  auto l = PageLayout::Make(KvFormat::kMxfp4, 128, 64, 16, 16, 4);
  ASSERT_TRUE(l.ok());
  EXPECT_THAT(l->DebugString(), HasSubstr("mxfp4"));
  EXPECT_THAT(l->DebugString(), HasSubstr("n_per_tile=16"));
  EXPECT_THAT(l->DebugString(), HasSubstr("scale_lanes=4"));
  auto lin = PageLayout::Make(KvFormat::kFp8, 128, 64);
  EXPECT_THAT(lin->DebugString(), HasSubstr("linear"));
}

}  // namespace
}  // namespace indexer
