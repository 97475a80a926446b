// Asio and Beast compiled once for the whole program (separate compilation).
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
