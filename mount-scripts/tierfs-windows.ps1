<#
.SYNOPSIS
    Mount and unmount a tierfs drive on Windows (WinFsp), and point ComfyUI at it.

.DESCRIPTION
    tierfs-windows.ps1 mount   -Source D:\models -MountPoint M: [-RamCache 16GiB] [-Tierfs C:\tools\tierfs.exe]
    tierfs-windows.ps1 unmount -MountPoint M:
    tierfs-windows.ps1 comfyui -MountPoint M: [-ComfyUI C:\ComfyUI_windows_portable] [-Desktop]

    mount    starts tierfs.exe in the background (log: %LOCALAPPDATA%\tierfs\logs\<drive>.log)
             and returns once M:\.tierfs\stats answers. MountPoint is a free drive letter (M:)
             or a folder that does not exist yet (its parent must).
    unmount  stops that tierfs.exe. WinFsp removes the drive when the process that serves it
             exits, so stopping the process is the unmount.
    comfyui  writes a "tierfs" section (base_path and one line per ComfyUI model folder) into
             ComfyUI's model paths file, replacing an earlier "tierfs" section and keeping the
             rest (a .bak copy of the old file is kept):
               - portable install: <ComfyUI>\ComfyUI\extra_model_paths.yaml, where -ComfyUI is
                 the ComfyUI_windows_portable folder (or its ComfyUI subfolder);
               - desktop app (-Desktop): %APPDATA%\ComfyUI\extra_models_config.yaml.
             Restart ComfyUI afterwards.

    Needs WinFsp 2.x (winfsp.dev installer) and tierfs.exe built from winfs\ of the tierfs
    repository. This script was written against the documented behaviour of these tools; it has
    not been run on Windows (see docs/WINDOWS.md).
#>
[CmdletBinding()]
param(
    [Parameter(Mandatory = $true, Position = 0)]
    [ValidateSet('mount', 'unmount', 'comfyui')]
    [string]$Action,
    [string]$Source,
    [string]$MountPoint,
    [string]$RamCache,
    [string]$Tierfs,
    [string]$ComfyUI,
    [switch]$Desktop,
    [int]$WaitSeconds = 30
)

$ErrorActionPreference = 'Stop'
Set-StrictMode -Version 3

# ComfyUI folder name -> subfolder of the mount (the same table as `tierfs comfyui-config` on
# Linux, fs/src/comfyui.rs: the keys of folder_names_and_paths in ComfyUI's folder_paths.py).
$Folders = [ordered]@{
    checkpoints      = 'checkpoints'
    diffusion_models = 'diffusion_models'
    unet             = 'unet'
    loras            = 'loras'
    vae              = 'vae'
    clip             = 'clip'
    text_encoders    = 'text_encoders'
    clip_vision      = 'clip_vision'
    controlnet       = 'controlnet'
    upscale_models   = 'upscale_models'
    embeddings       = 'embeddings'
}
$SectionName = 'tierfs'

function Fail([string]$Message) {
    Write-Error "tierfs-windows.ps1: $Message"
    exit 1
}

function Require([string]$Name, $Value) {
    if ([string]::IsNullOrWhiteSpace($Value)) { Fail "-$Name is required for '$Action'" }
}

# The state folder: pid files and logs, one per mount point.
function StateDir {
    $dir = Join-Path $env:LOCALAPPDATA 'tierfs'
    New-Item -ItemType Directory -Force -Path (Join-Path $dir 'logs') | Out-Null
    return $dir
}

# A file-name-safe key for a mount point: "M:" -> "M", "C:\mnt\models" -> "C_mnt_models".
function MountKey([string]$Mp) {
    return ($Mp.TrimEnd('\') -replace '[:\\/ ]+', '_').Trim('_')
}

function FindTierfs {
    if ($Tierfs) {
        if (-not (Test-Path -LiteralPath $Tierfs -PathType Leaf)) { Fail "-Tierfs $Tierfs is not a file" }
        return (Resolve-Path -LiteralPath $Tierfs).Path
    }
    $cmd = Get-Command tierfs.exe -ErrorAction SilentlyContinue
    if ($cmd) { return $cmd.Source }
    $built = Join-Path $PSScriptRoot '..\winfs\target\release\tierfs.exe'
    if (Test-Path -LiteralPath $built) { return (Resolve-Path -LiteralPath $built).Path }
    Fail 'tierfs.exe not found: pass -Tierfs, or put it on PATH'
}

function Mount-Tierfs {
    Require 'Source' $Source
    Require 'MountPoint' $MountPoint
    if (-not (Test-Path -LiteralPath $Source -PathType Container)) { Fail "-Source $Source is not a folder" }
    $stats = Join-Path $MountPoint '.tierfs\stats'
    if (Test-Path -LiteralPath $stats) {
        Write-Host "tierfs is already mounted at $MountPoint"
        return
    }
    if ($MountPoint -notmatch '^[A-Za-z]:$' -and (Test-Path -LiteralPath $MountPoint)) {
        Fail "$MountPoint exists: WinFsp mounts on a folder that does not exist yet (or use a drive letter)"
    }
    $exe = FindTierfs
    $state = StateDir
    $key = MountKey $MountPoint
    $log = Join-Path $state "logs\$key.log"
    $arguments = @('mount', "`"$Source`"", "`"$MountPoint`"")
    if ($RamCache) { $arguments += @('--ram-cache', $RamCache) }
    $proc = Start-Process -FilePath $exe -ArgumentList $arguments -WindowStyle Hidden `
        -RedirectStandardError $log -PassThru
    Set-Content -LiteralPath (Join-Path $state "$key.pid") -Value $proc.Id
    $deadline = (Get-Date).AddSeconds($WaitSeconds)
    while (-not (Test-Path -LiteralPath $stats)) {
        if ($proc.HasExited) {
            Fail "tierfs exited with code $($proc.ExitCode) before the mount answered; see $log"
        }
        if ((Get-Date) -gt $deadline) {
            Stop-Process -Id $proc.Id -Force -ErrorAction SilentlyContinue
            Fail "$MountPoint did not answer within $WaitSeconds s; see $log"
        }
        Start-Sleep -Milliseconds 250
    }
    Write-Host "tierfs: $Source mounted at $MountPoint (pid $($proc.Id), log $log)"
}

function Unmount-Tierfs {
    Require 'MountPoint' $MountPoint
    $pidFile = Join-Path (StateDir) "$(MountKey $MountPoint).pid"
    if (-not (Test-Path -LiteralPath $pidFile)) { Fail "no tierfs started by this script at $MountPoint" }
    $id = [int](Get-Content -LiteralPath $pidFile -TotalCount 1)
    $proc = Get-Process -Id $id -ErrorAction SilentlyContinue
    if ($proc -and $proc.ProcessName -eq 'tierfs') {
        Stop-Process -Id $id -Force
        $proc.WaitForExit(10000) | Out-Null
    }
    Remove-Item -LiteralPath $pidFile -Force
    $deadline = (Get-Date).AddSeconds($WaitSeconds)
    while (Test-Path -LiteralPath (Join-Path $MountPoint '.tierfs\stats')) {
        if ((Get-Date) -gt $deadline) { Fail "$MountPoint still answers after stopping tierfs" }
        Start-Sleep -Milliseconds 250
    }
    Write-Host "tierfs: unmounted $MountPoint"
}

# A YAML double-quoted scalar (JSON string syntax, which YAML parsers read): any path is safe.
function Quote([string]$Text) {
    return ConvertTo-Json -InputObject $Text -Compress
}

function Section([string]$Base) {
    # The comment is indented, so that it belongs to the section and goes with it on a rewrite.
    $lines = @("$($SectionName):",
        "    # ComfyUI model folders served by tierfs from $Base (written by tierfs-windows.ps1)",
        "    base_path: $(Quote $Base)")
    foreach ($name in $Folders.Keys) {
        $sub = $Folders[$name]
        if (-not (Test-Path -LiteralPath (Join-Path $Base $sub)) -and
            (Test-Path -LiteralPath (Join-Path $Base "models\$sub"))) {
            $sub = "models/$sub"   # the mount is a whole ComfyUI folder
        }
        $lines += "    $($name): $(Quote $sub)"
    }
    return $lines
}

# The file's lines without its top-level "tierfs:" section (up to the next top-level key).
function WithoutSection([string[]]$Lines) {
    $out = New-Object System.Collections.Generic.List[string]
    $skipping = $false
    foreach ($line in $Lines) {
        if ($line -match '^[^\s#]') { $skipping = ($line -match "^$([regex]::Escape($SectionName))\s*:") }
        if (-not $skipping) { $out.Add($line) }
    }
    return $out.ToArray()
}

function Write-ComfyUIConfig {
    Require 'MountPoint' $MountPoint
    if ($Desktop) {
        $file = Join-Path $env:APPDATA 'ComfyUI\extra_models_config.yaml'
    } else {
        Require 'ComfyUI' $ComfyUI
        if (-not (Test-Path -LiteralPath $ComfyUI -PathType Container)) { Fail "-ComfyUI $ComfyUI is not a folder" }
        $root = (Resolve-Path -LiteralPath $ComfyUI).Path
        if (Test-Path -LiteralPath (Join-Path $root 'ComfyUI\main.py')) { $root = Join-Path $root 'ComfyUI' }
        if (-not (Test-Path -LiteralPath (Join-Path $root 'main.py'))) {
            Fail "$ComfyUI is not a ComfyUI portable folder (no main.py in it or in its ComfyUI subfolder)"
        }
        $file = Join-Path $root 'extra_model_paths.yaml'
    }
    $base = $MountPoint.TrimEnd('\') + '\'
    if (-not (Test-Path -LiteralPath (Join-Path $base '.tierfs\stats'))) {
        Write-Warning "$MountPoint is not a live tierfs mount; folders are looked up in it as it is now"
    }
    $old = @()
    if (Test-Path -LiteralPath $file) {
        Copy-Item -LiteralPath $file -Destination "$file.bak" -Force
        $old = @(WithoutSection (Get-Content -LiteralPath $file))
    } else {
        New-Item -ItemType Directory -Force -Path (Split-Path -Parent $file) | Out-Null
    }
    $new = @($old) + @(Section $base)
    # UTF-8 without a byte-order mark (Windows PowerShell's -Encoding UTF8 writes one, and
    # ComfyUI opens the file as plain utf-8).
    [System.IO.File]::WriteAllLines($file, [string[]]$new, (New-Object System.Text.UTF8Encoding $false))
    Write-Host "tierfs: wrote the '$SectionName' section of $file; restart ComfyUI to use it"
}

switch ($Action) {
    'mount' { Mount-Tierfs }
    'unmount' { Unmount-Tierfs }
    'comfyui' { Write-ComfyUIConfig }
}
