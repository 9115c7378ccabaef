// Python's str methods as chat templates call them (ASCII case mapping; splitting, stripping
// and replacing on UTF-8 bytes, which matches Python's code-point results).
#pragma once

#include "runtime/jinja/value.hpp"

#include <string>
#include <vector>

namespace tandem::jinja {

class evaluator;

bool py_space(char c);
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
std::vector<std::string> py_split(const std::string& s, const std::string& sep, int64_t maxsplit);
std::vector<std::string> py_rsplit(const std::string& s, const std::string& sep, int64_t maxsplit);
std::vector<std::string> py_split_ws(const std::string& s, int64_t maxsplit, bool from_right);
std::string py_replace(const std::string& s, const std::string& old, const std::string& neu, int64_t count,
                       size_t max_size);
std::string ascii_upper(std::string s);
std::string ascii_lower(std::string s);
std::string py_title(const std::string& s);      // str.title()
std::string jinja_title(const std::string& s);   // the title filter
std::string py_capitalize(const std::string& s);
bool py_is(const std::string& s, const std::string& what); // isdigit, isalpha, ...
std::string py_str_format(evaluator& ev, const std::string& fmt, const call_args& args);
// One replacement field's spec of str.format ("{:>8.2f}"): [[fill]align][sign][0][width][.precision][type].
std::string format_spec(const value& v, const std::string& spec);

} // namespace tandem::jinja
