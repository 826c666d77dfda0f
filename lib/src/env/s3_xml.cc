#include "lib/src/env/s3_xml.h"

#include <expat.h>

#include <memory>

namespace lifeline {
namespace {

constexpr size_t kMaxDepth = 64;

struct TreeBuilder {
  XmlElement root;
  std::vector<XmlElement*> open;  // the path from the document element to the current one
  bool seen_root = false;
  bool too_deep = false;
  XML_Parser parser = nullptr;
};

std::string LocalName(const XML_Char* name) {
  std::string_view n(name);
  // With namespace processing expat reports "uri<sep>local"; the separator chosen below is '\x01'.
  const size_t sep = n.rfind('\x01');
  if (sep != std::string_view::npos) n.remove_prefix(sep + 1);
  return std::string(n);
}

void XMLCALL OnStart(void* data, const XML_Char* name, const XML_Char** /*attributes*/) {
  auto* b = static_cast<TreeBuilder*>(data);
  if (b->open.size() >= kMaxDepth) {
    b->too_deep = true;
    XML_StopParser(b->parser, XML_FALSE);
    return;
  }
  XmlElement* element;
  if (b->open.empty()) {
    element = &b->root;
    b->seen_root = true;
  } else {
    b->open.back()->children.emplace_back();
    element = &b->open.back()->children.back();
  }
  element->name = LocalName(name);
  b->open.push_back(element);
}

void XMLCALL OnEnd(void* data, const XML_Char* /*name*/) {
  auto* b = static_cast<TreeBuilder*>(data);
  if (!b->open.empty()) b->open.pop_back();
}

void XMLCALL OnText(void* data, const XML_Char* s, int len) {
  auto* b = static_cast<TreeBuilder*>(data);
  if (!b->open.empty()) b->open.back()->text.append(s, static_cast<size_t>(len));
}

}  // namespace

const XmlElement* XmlElement::Child(std::string_view child_name) const {
  for (const XmlElement& c : children)
    if (c.name == child_name) return &c;
  return nullptr;
}

std::string XmlElement::ChildText(std::string_view child_name) const {
  const XmlElement* c = Child(child_name);
  return c != nullptr ? c->text : std::string();
}

Result<XmlElement> ParseXml(std::string_view document, std::string_view what) {
  std::unique_ptr<XML_ParserStruct, void (*)(XML_Parser)> parser(XML_ParserCreateNS(nullptr, '\x01'),
                                                                 XML_ParserFree);
  if (parser == nullptr) return Status::ResourceExhausted(what, "cannot create an XML parser");
  // Children are pointers into vectors that grow; the builder only ever appends to the innermost
  // open element, whose parent's vector no longer changes while it is open.
  TreeBuilder builder;
  builder.parser = parser.get();
  XML_SetUserData(parser.get(), &builder);
  XML_SetElementHandler(parser.get(), OnStart, OnEnd);
  XML_SetCharacterDataHandler(parser.get(), OnText);
  const XML_Status st = XML_Parse(parser.get(), document.data(), static_cast<int>(document.size()), XML_TRUE);
  if (builder.too_deep) return Status::Corruption(what, "XML nested deeper than 64 elements");
  if (st != XML_STATUS_OK) {
    return Status::Corruption(what, std::string("malformed XML: ") + XML_ErrorString(XML_GetErrorCode(parser.get())) +
                                        " at line " + std::to_string(XML_GetCurrentLineNumber(parser.get())));
  }
  if (!builder.seen_root) return Status::Corruption(what, "empty XML document");
  return std::move(builder.root);
}

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace lifeline
