# Install rules and the Debian package: `cpack -G DEB` in the build directory writes
# kvpersist_<version>-<release>_<arch>.deb (scripts/package-test.sh builds, lints, installs,
# runs and purges it). Paths follow Debian 12: the binary in /usr/bin, the unit in
# /lib/systemd/system, the configuration as a conffile in /etc/kvpersist.
include(GNUInstallDirs)

set(KVP_DEB_RELEASE 1)
set(KVP_UNIT_SOURCE ${CMAKE_SOURCE_DIR}/systemd/kvpersist.service)
set(KVP_UNIT_DIR /lib/systemd/system)
set(KVP_PACKAGING_DIR ${CMAKE_SOURCE_DIR}/packaging)
set(KVP_DOC_DIR ${CMAKE_INSTALL_DATADIR}/doc/kvpersist)

# The changelog's latest entry must name the version being packaged (lintian and dpkg read it);
# its signer is the package's Maintainer, so the address is written in one place.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${KVP_PACKAGING_DIR}/changelog.Debian)
file(STRINGS ${KVP_PACKAGING_DIR}/changelog.Debian changelog_top LIMIT_COUNT 1)
if(NOT changelog_top MATCHES "^kvpersist \\(${PROJECT_VERSION}-${KVP_DEB_RELEASE}\\) ")
  message(FATAL_ERROR "packaging/changelog.Debian: the latest entry is '${changelog_top}', "
                      "not kvpersist (${PROJECT_VERSION}-${KVP_DEB_RELEASE}): add an entry")
endif()
file(STRINGS ${KVP_PACKAGING_DIR}/changelog.Debian changelog_signer REGEX "^ -- " LIMIT_COUNT 1)
string(REGEX REPLACE "^ -- ([^<]+<[^>]+>).*" "\\1" KVP_DEB_MAINTAINER "${changelog_signer}")

# gzip -9n: maximum compression, no name or timestamp in the header (reproducible; lintian).
set(KVP_GZIPPED ${CMAKE_BINARY_DIR}/packaging/kvpersist.1.gz ${CMAKE_BINARY_DIR}/packaging/changelog.Debian.gz)
foreach(gz IN LISTS KVP_GZIPPED)
  get_filename_component(name ${gz} NAME_WLE)
  add_custom_command(OUTPUT ${gz}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/packaging
    COMMAND sh -c "gzip -9n -c \"$1\" > \"$2\"" gzip ${KVP_PACKAGING_DIR}/${name} ${gz}
    DEPENDS ${KVP_PACKAGING_DIR}/${name} VERBATIM)
endforeach()
add_custom_target(kvp_packaging_docs ALL DEPENDS ${KVP_GZIPPED})

set(KVP_DATA_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
install(TARGETS kvpersist RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${CMAKE_SOURCE_DIR}/config/kvpersist.example.yaml DESTINATION /etc/kvpersist
        RENAME kvpersist.yaml PERMISSIONS ${KVP_DATA_PERMISSIONS})
configure_file(${CMAKE_SOURCE_DIR}/cmake/install_unit.cmake.in
               ${CMAKE_BINARY_DIR}/packaging/install_unit.cmake @ONLY)
install(SCRIPT ${CMAKE_BINARY_DIR}/packaging/install_unit.cmake)
install(FILES ${CMAKE_BINARY_DIR}/packaging/kvpersist.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1
        PERMISSIONS ${KVP_DATA_PERMISSIONS})
install(FILES ${KVP_PACKAGING_DIR}/copyright ${CMAKE_BINARY_DIR}/packaging/changelog.Debian.gz
        DESTINATION ${KVP_DOC_DIR} PERMISSIONS ${KVP_DATA_PERMISSIONS})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvpersist)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${KVP_DEB_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "keeps llama-server sessions warm across switches and restarts")
# the extended description; the summary above is the first line of Description:
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "kvpersist is a reverse proxy in front of llama.cpp's llama-server. When another
agent session needs the server's slot, it saves the slot's KV cache to disk
through llama-server's slot API and restores it when the session returns, so a
returning session does not prefill its whole prompt again.")
# Install into the package with DESTDIR and the prefix /usr itself (not a staging path): the
# unit's ExecStart is built from CMAKE_INSTALL_PREFIX at install time (install_unit.cmake.in).
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_INSTALL_DEFAULT_DIRECTORY_PERMISSIONS
    OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${KVP_DEB_RELEASE})
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Depends: from the binary's shared libraries (dpkg-shlibdeps, in dpkg-dev).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${KVP_PACKAGING_DIR}/conffiles ${KVP_PACKAGING_DIR}/postinst
    ${KVP_PACKAGING_DIR}/prerm ${KVP_PACKAGING_DIR}/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
