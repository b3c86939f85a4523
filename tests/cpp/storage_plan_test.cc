/*! \file storage_plan_test.cc \brief Device assignment and the storage pool, directly. */
#include <gtest/gtest.h>
#include <tvm/ffi/error.h>
#include <tvm_hetero/device_assignment.h>
#include <tvm_hetero/storage_plan.h>

#include "test_graphs.h"

namespace tvm_hetero {
namespace {

using testing::ChainJSON;
using testing::SimplexJSON;
const std::vector<DLDevice> kTwoCPUs = {{kDLCPU, 0}, {kDLCPU, 1}};

TEST(DeviceAssignment, PositionsIndexTheDeviceList) {
  Graph g = ParseGraphJSON(SimplexJSON());
  EXPECT_EQ(AssignDevices(g, kTwoCPUs, DeviceIndexKind::kPosition), (std::vector<int>{1, 1, 0, 1, 0, 0}));
}

TEST(DeviceAssignment, LegacyDeviceTypesMapToFirstDeviceOfThatType) {
  Graph g = ParseGraphJSON(SimplexJSON("[0, 1, 2, 3, 4, 5]", "[1, 1, 1, 1, 1, 1]"));
  std::vector<DLDevice> devices = {{kDLCUDA, 0}, {kDLCPU, 3}, {kDLCPU, 0}};
  EXPECT_EQ(AssignDevices(g, devices, DeviceIndexKind::kDeviceType), (std::vector<int>{1, 1, 1, 1, 1, 1}));
  EXPECT_THROW(AssignDevices(g, {{kDLCUDA, 0}}, DeviceIndexKind::kDeviceType), tvm::ffi::Error);
}

TEST(DeviceAssignment, OutOfRangeNamesTheNode) {
  Graph g = ParseGraphJSON(SimplexJSON("[0, 1, 2, 3, 4, 5]", "[1, 1, 0, 7, 0, 0]"));
  try {
    AssignDevices(g, kTwoCPUs, DeviceIndexKind::kPosition);
    FAIL() << "no error";
  } catch (const tvm::ffi::Error& err) {
    EXPECT_NE(err.message().find("node 3 'add': device_index 7 is out of range"), std::string::npos)
        << err.message();
  }
}

TEST(StoragePlan, OneSlotPerStorageIdSizedByLargestUser) {
  // c reuses a's id (a is dead once b has read it); c is float32[8], so the slot is 32 bytes.
  Graph g = ParseGraphJSON(ChainJSON("[0, 1, 2, 1]", "[4], [4], [4], [8]"));
  StoragePlan plan = PlanStorage(g, AssignDevices(g, kTwoCPUs, DeviceIndexKind::kPosition));
  EXPECT_EQ(plan.slots.size(), 3u);
  EXPECT_EQ(plan.entry_slot[1], plan.entry_slot[3]);
  EXPECT_EQ(plan.slots[plan.entry_slot[1]].nbytes, 32u);
  EXPECT_EQ(plan.BytesPerDevice(2), (std::vector<size_t>{16 + 32 + 16, 0}));
}

TEST(StoragePlan, EntriesLiveAtOnceSharingBytesAreRejectedNamingBoth) {
  // b reuses a's id while reading a: the kernel would overwrite its own input.
  Graph g = ParseGraphJSON(ChainJSON("[0, 1, 1, 2]"));
  try {
    PlanStorage(g, AssignDevices(g, kTwoCPUs, DeviceIndexKind::kPosition));
    FAIL() << "no error";
  } catch (const tvm::ffi::Error& err) {
    EXPECT_NE(err.message().find("storage_id 1: node 1 'a' (bytes [0, 16)) and node 2 'b' (bytes [0, 16)) are "
                                 "live at once but share bytes"),
              std::string::npos)
        << err.message();
  }
  // An input lives for ever: reusing its id later is rejected too; the output lives to the end.
  EXPECT_THROW(PlanStorage(ParseGraphJSON(ChainJSON("[0, 1, 2, 0]")), {0, 0, 0, 0}), tvm::ffi::Error);
  // Disjoint bytes of one id are fine while both live.
  Graph offsets = ParseGraphJSON(ChainJSON("[0, 1, 1, 2]", "[4], [4], [4], [4]", "[0, 0, 64, 0]"));
  EXPECT_NO_THROW(PlanStorage(offsets, {0, 0, 0, 0}));
}

TEST(StoragePlan, OffsetsPlaceEntriesInsideOneSlot) {
  // A, B and add live at once on device 1: one storage id, three offsets.
  Graph g = ParseGraphJSON(SimplexJSON("[0, 0, 2, 0, 4, 5]", "[1, 1, 0, 1, 0, 0]", "[0, 64, 0, 128, 0, 0]"));
  StoragePlan plan = PlanStorage(g, AssignDevices(g, kTwoCPUs, DeviceIndexKind::kPosition));
  EXPECT_EQ(plan.slots.size(), 4u);
  EXPECT_EQ(plan.entry_slot[0], plan.entry_slot[3]);
  EXPECT_EQ(plan.entry_offset, (std::vector<size_t>{0, 64, 0, 128, 0, 0}));
  EXPECT_EQ(plan.slots[plan.entry_slot[0]].nbytes, 128u + 16u);  // the highest user's end
}

TEST(StoragePlan, WithoutPointerOffsetsEachOffsetGetsItsOwnSlot) {
  Graph g = ParseGraphJSON(SimplexJSON("[0, 0, 2, 0, 4, 5]", "[1, 1, 0, 1, 0, 0]", "[0, 64, 0, 128, 0, 0]"));
  StoragePlan plan = PlanStorage(g, AssignDevices(g, kTwoCPUs, DeviceIndexKind::kPosition), {true, false});
  EXPECT_EQ(plan.slots.size(), 6u);
  EXPECT_EQ(plan.entry_offset, (std::vector<size_t>(6, 0)));
  EXPECT_EQ(plan.BytesPerDevice(2), (std::vector<size_t>{3 * 16, 3 * 16}));
}

TEST(StoragePlan, StorageIdAcrossDevicesNamesBothNodes) {
  Graph g = ParseGraphJSON(SimplexJSON("[0, 1, 2, 3, 3, 5]"));
  try {
    PlanStorage(g, AssignDevices(g, kTwoCPUs, DeviceIndexKind::kPosition));
    FAIL() << "no error";
  } catch (const tvm::ffi::Error& err) {
    EXPECT_NE(err.message().find("storage_id 3 is shared across devices: node 3 'add' on device 1 and "
                                 "node 4 'copy' on device 0"),
              std::string::npos)
        << err.message();
  }
}

TEST(StoragePlan, EntryBytesCountsBitsAndLanes) {
  EXPECT_EQ(EntryBytes({2, 3}, DLDataType{kDLFloat, 32, 1}), 24u);
  EXPECT_EQ(EntryBytes({10}, DLDataType{kDLBool, 8, 1}), 10u);
  EXPECT_EQ(EntryBytes({}, DLDataType{kDLFloat, 16, 1}), 2u);
  EXPECT_EQ(EntryBytes({3}, DLDataType{kDLUInt, 1, 1}), 1u);
}

}  // namespace
}  // namespace tvm_hetero
