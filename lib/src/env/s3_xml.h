// The XML of S3 responses (listings, multipart results, errors), read with expat into a small tree.
// Responses are at most a few MiB (a listing page of 1000 keys), so a tree is simpler than
// streaming callbacks and costs nothing that matters.
#ifndef LIFELINE_SRC_ENV_S3_XML_H_
#define LIFELINE_SRC_ENV_S3_XML_H_

#include <string>
#include <string_view>
#include <vector>

#include "lifeline/status.h"

namespace lifeline {

// One element: its local name (any namespace prefix dropped), its text (the concatenated character
// data directly inside it, entities decoded) and its child elements in document order.
struct XmlElement {
  std::string name;
  std::string text;
  std::vector<XmlElement> children;

  // The first child named `name`, or null.
  const XmlElement* Child(std::string_view child_name) const;
  // The text of the first child named `name`, or "" when there is none.
  std::string ChildText(std::string_view child_name) const;
};

// Parses a whole document. Corruption naming `what` (and expat's reason and line) for anything that
// is not well-formed XML, or nesting deeper than 64 elements.
Result<XmlElement> ParseXml(std::string_view document, std::string_view what);

// `text` with &, <, >, " and ' escaped, for request bodies.
std::string XmlEscape(std::string_view text);

}  // namespace lifeline

#endif  // LIFELINE_SRC_ENV_S3_XML_H_
