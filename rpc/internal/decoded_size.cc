#include "rpc/internal/decoded_size.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <typeinfo>

namespace rdmarpc::internal {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// Bytes per occurrence, from above (see the header).
constexpr size_t kUnknownEntry = 32;     // an UnknownField (16 bytes) in a vector that grows
constexpr size_t kUnknownSet = 64;       // a message's first unknown field: the set that keeps them
constexpr size_t kHeapString = 48;       // a std::string of its own, with malloc's header
constexpr size_t kLongStringExtra = 16;  // malloc's header of a string past the inline 15 bytes
constexpr size_t kRepeatedSlot = 16;     // a pointer or scalar in an array that grows
constexpr size_t kMessageBase = 48;      // a message object's fixed part, with malloc's header
constexpr size_t kFieldBytes = 8;        // and each field's room in it
constexpr size_t kRepeatedFieldBytes = 24;  // a repeated field's array header
constexpr size_t kMapFieldBytes = 144;      // a map field's table and its mirror
constexpr size_t kMapNode = 96;             // a map entry's node: hash links, key and value
constexpr int kMaxDepth = 100;              // protobuf's default recursion limit

size_t StringCost(uint64_t len) { return kHeapString + (len > 15 ? len + kLongStringExtra : 0); }

// A message object of type `d`, from the fields it declares (a class's layout: a pointer or
// scalar each, a repeated field's array header, a map field's table and its mirror), with its
// fixed part and malloc's header; remembered per thread for the types met last.
size_t MessageCost(const Descriptor& d) {
  struct Entry {
    const Descriptor* type = nullptr;
    size_t bytes = 0;
  };
  thread_local Entry cache[16];
  Entry& e = cache[(reinterpret_cast<uintptr_t>(&d) >> 4) % 16];
  if (e.type != &d) {
    size_t bytes = kMessageBase;
    for (int i = 0; i < d.field_count(); ++i) {
      const FieldDescriptor* f = d.field(i);
      bytes += f->is_map() ? kMapFieldBytes : f->is_repeated() ? kRepeatedFieldBytes : kFieldBytes;
    }
    e = {&d, bytes};
  }
  return e.bytes;
}

// The wire type a scalar field takes unpacked: 1 (64 bits), 5 (32 bits) or 0 (a varint).
int ScalarWire(const FieldDescriptor& f) {
  switch (f.type()) {
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
    case FieldDescriptor::TYPE_DOUBLE:
      return 1;
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
    case FieldDescriptor::TYPE_FLOAT:
      return 5;
    default:
      return 0;
  }
}

// The elements of a packed repeated scalar field's bytes.
size_t PackedCount(const FieldDescriptor& f, const uint8_t* p, const uint8_t* end) {
  switch (ScalarWire(f)) {
    case 1:
      return static_cast<size_t>(end - p) / 8;
    case 5:
      return static_cast<size_t>(end - p) / 4;
    default:  // varints: one element ends at each byte without the continuation bit
      return static_cast<size_t>(std::count_if(p, end, [](uint8_t b) { return b < 0x80; }));
  }
}

// Most messages number their fields 1, 2, 3...: field(number - 1) then is the one, found without
// protobuf's table look-up (a call into libprotobuf, ~50 instructions).
const FieldDescriptor* FindField(const Descriptor& type, uint32_t number) {
  if (number - 1 < static_cast<uint32_t>(type.field_count())) {
    const FieldDescriptor* f = type.field(static_cast<int>(number - 1));
    if (static_cast<uint32_t>(f->number()) == number) return f;
  }
  return type.FindFieldByNumber(static_cast<int>(number));
}

// What a field is, for the walk: looked up once per run of one field number.
struct FieldKind {
  enum Kind : uint8_t { kUnknown, kScalar, kString, kMessage, kGroup } kind = kUnknown;
  bool repeated = false;
  bool packable = false;  // a repeated scalar, which may come packed
  const FieldDescriptor* field = nullptr;
  const Descriptor* message = nullptr;  // kMessage, kGroup
  size_t map_node = 0;                  // map fields: a node of the map (key, value) per entry
  int scalar_wire = -1;                 // kScalar: the wire type it takes unpacked

  static FieldKind Of(const FieldDescriptor* f) {
    FieldKind k;
    if (f == nullptr) return k;
    k.field = f;
    k.repeated = f->is_repeated();
    switch (f->type()) {
      case FieldDescriptor::TYPE_STRING:
      case FieldDescriptor::TYPE_BYTES:
        k.kind = kString;
        break;
      case FieldDescriptor::TYPE_MESSAGE:
        k.kind = kMessage;
        k.message = f->message_type();
        if (f->is_map()) {  // the map's node, and its value object made even when not sent
          const FieldDescriptor* value = k.message->map_value();
          k.map_node = kMapNode + (value->type() == FieldDescriptor::TYPE_MESSAGE
                                       ? MessageCost(*value->message_type())
                                       : 0);
        }
        break;
      case FieldDescriptor::TYPE_GROUP:
        k.kind = kGroup;
        k.message = f->message_type();
        break;
      default:
        k.kind = kScalar;
        k.packable = k.repeated;
        k.scalar_wire = ScalarWire(*f);
        break;
    }
    return k;
  }
  // A varint or fixed-size value of wire type `wire` that the field takes: nothing for a singular
  // scalar (it lives in the message), a slot for a repeated one. False when the field does not
  // take it (unknown, or another wire type): it is kept as an unknown field.
  bool TakesScalar(int wire, size_t* cost) const {
    if (kind != kScalar || wire != scalar_wire) return false;
    *cost = repeated ? kRepeatedSlot : 0;
    return true;
  }
};

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
    FieldKind k;
    bool unknown_seen = false;
    while (p_ < end) {
      uint64_t tag;
      if (!Varint(end, &tag)) return false;
      const auto number = static_cast<uint32_t>(tag >> 3);
      const int wire = static_cast<int>(tag & 7);
      if (number == 0) return false;
      if (wire == 4) return group == number;  // END_GROUP: ours ends the group, any other is bad
      // Repeated fields come as runs of one number: look each run up once.
      if (number != last_number) {
        k = FieldKind::Of(type ? FindField(*type, number) : nullptr);
        last_number = number;
      }
      switch (wire) {
        case 0: {
          uint64_t ignored;
          if (!Varint(end, &ignored)) return false;
          Scalar(k, wire, unknown_seen);
          break;
        }
        case 1:
        case 5: {
          const size_t n = wire == 1 ? 8 : 4;
          if (static_cast<size_t>(end - p_) < n) return false;
          p_ += n;
          Scalar(k, wire, unknown_seen);
          break;
        }
        case 2: {
          uint64_t len;
          if (!Varint(end, &len) || len > static_cast<uint64_t>(end - p_)) return false;
          const uint8_t* sub_end = p_ + len;
          const size_t slot = k.repeated ? kRepeatedSlot : 0;
          if (k.kind == FieldKind::kString) {
            total_ += slot + StringCost(len);
          } else if (k.kind == FieldKind::kMessage) {
            total_ += slot + MessageCost(*k.message) + k.map_node;
            if (!Fields(k.message, sub_end, depth + 1, 0)) return false;
            if (p_ != sub_end) return false;
          } else if (k.packable) {
            total_ += kRepeatedSlot * PackedCount(*k.field, p_, sub_end);
          } else {  // unknown, or a wire type the field does not take: kept as an unknown field
            total_ += Unknown(unknown_seen) + StringCost(len);
          }
          p_ = sub_end;
          break;
        }
        case 3: {
          if (k.kind == FieldKind::kGroup) {
            total_ += (k.repeated ? kRepeatedSlot : 0) + MessageCost(*k.message);
            if (!Fields(k.message, end, depth + 1, number)) return false;
          } else {  // an unknown group: an entry holding a field set of its own
            total_ += Unknown(unknown_seen) + kHeapString;
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
  // An unknown field's entry, and with a message's first one the set that keeps them.
  static size_t Unknown(bool& seen) {
    if (seen) return kUnknownEntry;
    seen = true;
    return kUnknownEntry + kUnknownSet;
  }
  void Scalar(const FieldKind& k, int wire, bool& unknown_seen) {
    size_t cost;
    total_ += k.TakesScalar(wire, &cost) ? cost : Unknown(unknown_seen);
  }
  bool Varint(const uint8_t* end, uint64_t* out) {
    if (p_ < end && *p_ < 0x80) [[likely]] {  // tags and small values: one byte
      *out = *p_++;
      return true;
    }
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

// Whether `t` is the generated class of `d` (not, say, a DynamicMessage of it).
bool IsGeneratedClass(const Descriptor& d, const std::type_info& t) {
  if (d.file()->pool() != google::protobuf::DescriptorPool::generated_pool()) return false;
  const google::protobuf::Message* prototype =
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(&d);
  return prototype != nullptr && typeid(*prototype) == t;
}

}  // namespace

size_t DecodedBytes(const Descriptor& type, std::span<const std::byte> payload) {
  const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  Walker w(p);
  w.Fields(&type, p + payload.size(), 0, 0);
  if (w.too_deep()) return std::numeric_limits<size_t>::max();
  return std::max(MessageCost(type) + w.total(), payload.size());
}

size_t DecodedExcess(const Descriptor& type, std::span<const std::byte> payload) {
  if (payload.size() < kDecodedCheckFromBytes) return 0;
  const size_t decoded = DecodedBytes(type, payload);
  return decoded == std::numeric_limits<size_t>::max() ? 0 : decoded - payload.size();
}

size_t DecodedExcess(const google::protobuf::MessageLite& into,
                     std::span<const std::byte> payload) {
  if (payload.size() < kDecodedCheckFromBytes) return 0;
  // The type's descriptor, remembered per thread for the last type seen: dynamic_cast and
  // GetDescriptor (a std::call_once each time) cost ~200 instructions, and a thread mostly sees
  // the same few types.
  // Only where the class names the type: a lite class (no descriptor) or a generated one (the
  // generated prototype of its descriptor is of the same class); one DynamicMessage class serves
  // every dynamic type.
  thread_local const std::type_info* last_type = nullptr;
  thread_local const Descriptor* last_descriptor = nullptr;
  const std::type_info& t = typeid(into);
  const Descriptor* descriptor = last_descriptor;
  if (last_type != &t) {
    const auto* full = dynamic_cast<const google::protobuf::Message*>(&into);
    descriptor = full ? full->GetDescriptor() : nullptr;
    if (full == nullptr || IsGeneratedClass(*descriptor, t)) {
      last_type = &t;
      last_descriptor = descriptor;
    }
  }
  return descriptor == nullptr ? 0 : DecodedExcess(*descriptor, payload);
}

std::string ParsedTooLargeText(std::string_view what, size_t bytes, size_t excess, size_t allowed,
                               std::string_view bound) {
  std::string text(what);
  text += " of " + std::to_string(bytes) + " bytes would take about " +
          std::to_string(bytes + excess) +
          " once parsed (many small or unknown fields), more than the " + std::to_string(allowed) +
          " bytes ";
  text += bound;
  return text;
}

}  // namespace rdmarpc::internal
