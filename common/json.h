// Writing JSON, HTML and XML by hand (summary.json, the CLI's --json, the
// status page, S3 requests): string escaping.
#ifndef STRATA_COMMON_JSON_H_
#define STRATA_COMMON_JSON_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace strata {

// The contents of a JSON string holding `in`: quotes, backslashes and
// control characters escaped.
inline std::string JsonEscape(absl::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (char c : in) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out;
}

// `in` as HTML or XML text or attribute value: & < > " ' escaped.
inline std::string MarkupEscape(absl::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (char c : in) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace strata

#endif  // STRATA_COMMON_JSON_H_
