#include "rpc/internal/decoded_size.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace rdmarpc::internal {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// Bytes per occurrence, from above (see the header).
constexpr size_t kUnknownEntry = 32;      // an UnknownField (16 bytes) in a vector that grows
constexpr size_t kHeapString = 48;        // a std::string of its own, with malloc's header
constexpr size_t kLongStringExtra = 16;   // malloc's header of a string past the inline 15 bytes
constexpr size_t kRepeatedSlot = 16;      // a pointer or scalar in an array that grows
constexpr size_t kMessageBase = 48;       // a message object's fixed part, with malloc's header
constexpr size_t kPerDeclaredField = 16;  // and its room for each field it declares
constexpr int kMaxDepth = 100;            // protobuf's default recursion limit

size_t StringCost(uint64_t len) { return kHeapString + (len > 15 ? len + kLongStringExtra : 0); }

size_t MessageCost(const Descriptor& d) {
  return kMessageBase + kPerDeclaredField * static_cast<size_t>(d.field_count());
}

// The elements of a packed repeated scalar field's bytes.
size_t PackedCount(const FieldDescriptor& f, const uint8_t* p, const uint8_t* end) {
  switch (f.type()) {
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
    case FieldDescriptor::TYPE_FLOAT:
      return static_cast<size_t>(end - p) / 4;
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
    case FieldDescriptor::TYPE_DOUBLE:
      return static_cast<size_t>(end - p) / 8;
    default:  // varints: one element ends at each byte without the continuation bit
      return static_cast<size_t>(std::count_if(p, end, [](uint8_t b) { return b < 0x80; }));
  }
}

class Walker {
 public:
  explicit Walker(const uint8_t* p) : p_(p) {}

  // Walks fields of `type` (null: none known) up to `end`, or, for a group (`group` != 0), up to
  // its END_GROUP. False on malformed input and past the depth limit (too_deep() then).
  bool Fields(const Descriptor* type, const uint8_t* end, int depth, uint32_t group) {
    if (depth > kMaxDepth) {
      too_deep_ = true;
      return false;
    }
    uint32_t last_number = 0;
    const FieldDescriptor* last = nullptr;
    while (p_ < end) {
      uint64_t tag;
      if (!Varint(end, &tag)) return false;
      const auto number = static_cast<uint32_t>(tag >> 3);
      const int wire = static_cast<int>(tag & 7);
      if (number == 0) return false;
      if (wire == 4) return group == number;  // END_GROUP: ours ends the group, any other is bad
      const FieldDescriptor* f = nullptr;
      if (type) {
        // Repeated fields come as runs of one number: look each run up once.
        if (number != last_number) {
          last = type->FindFieldByNumber(static_cast<int>(number));
          last_number = number;
        }
        f = last;
      }
      switch (wire) {
        case 0: {
          uint64_t ignored;
          if (!Varint(end, &ignored)) return false;
          total_ += ScalarCost(f);
          break;
        }
        case 1:
        case 5: {
          const size_t n = wire == 1 ? 8 : 4;
          if (static_cast<size_t>(end - p_) < n) return false;
          p_ += n;
          total_ += ScalarCost(f);
          break;
        }
        case 2: {
          uint64_t len;
          if (!Varint(end, &len) || len > static_cast<uint64_t>(end - p_)) return false;
          const uint8_t* sub_end = p_ + len;
          if (f && f->type() == FieldDescriptor::TYPE_MESSAGE) {
            total_ += (f->is_repeated() ? kRepeatedSlot : 0) + MessageCost(*f->message_type());
            if (!Fields(f->message_type(), sub_end, depth + 1, 0)) return false;
            if (p_ != sub_end) return false;
            break;
          }
          if (f && (f->type() == FieldDescriptor::TYPE_STRING ||
                    f->type() == FieldDescriptor::TYPE_BYTES)) {
            total_ += (f->is_repeated() ? kRepeatedSlot : 0) + StringCost(len);
          } else if (f && f->is_repeated() && f->is_packable()) {
            total_ += kRepeatedSlot * PackedCount(*f, p_, sub_end);
          } else {  // unknown, or a wire type the field does not take: kept as an unknown field
            total_ += kUnknownEntry + StringCost(len);
          }
          p_ = sub_end;
          break;
        }
        case 3: {
          if (f && f->type() == FieldDescriptor::TYPE_GROUP) {
            total_ += (f->is_repeated() ? kRepeatedSlot : 0) + MessageCost(*f->message_type());
            if (!Fields(f->message_type(), end, depth + 1, number)) return false;
          } else {  // an unknown group: an entry holding a field set of its own
            total_ += kUnknownEntry + kHeapString;
            if (!Fields(nullptr, end, depth + 1, number)) return false;
          }
          break;
        }
        default:
          return false;
      }
    }
    return group == 0;  // a group must end with its END_GROUP
  }

  size_t total() const { return total_; }
  bool too_deep() const { return too_deep_; }

 private:
  static size_t ScalarCost(const FieldDescriptor* f) {
    if (f == nullptr || f->type() == FieldDescriptor::TYPE_MESSAGE ||
        f->type() == FieldDescriptor::TYPE_GROUP || f->type() == FieldDescriptor::TYPE_STRING ||
        f->type() == FieldDescriptor::TYPE_BYTES) {
      return kUnknownEntry;  // unknown, or a wire type the field does not take
    }
    return f->is_repeated() ? kRepeatedSlot : 0;
  }

  bool Varint(const uint8_t* end, uint64_t* out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && p_ < end; shift += 7) {
      const uint8_t b = *p_++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (b < 0x80) {
        *out = v;
        return true;
      }
    }
    return false;
  }

  const uint8_t* p_;
  size_t total_ = 0;
  bool too_deep_ = false;
};

}  // namespace

size_t DecodedBytes(const Descriptor& type, std::span<const std::byte> payload) {
  const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  Walker w(p);
  w.Fields(&type, p + payload.size(), 0, 0);
  if (w.too_deep()) return std::numeric_limits<size_t>::max();
  return std::max(MessageCost(type) + w.total(), payload.size());
}

size_t DecodedExcess(const google::protobuf::MessageLite& into,
                     std::span<const std::byte> payload) {
  if (payload.size() < kDecodedCheckFromBytes) return 0;
  const auto* full = dynamic_cast<const google::protobuf::Message*>(&into);
  if (full == nullptr) return 0;
  const size_t decoded = DecodedBytes(*full->GetDescriptor(), payload);
  return decoded == std::numeric_limits<size_t>::max() ? 0 : decoded - payload.size();
}

}  // namespace rdmarpc::internal
